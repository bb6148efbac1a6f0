"""Waiting for a run's end from application code (`everystep.result`).

The wait reads the run's row once per `POLL_SECONDS`, and no more. On
PostgreSQL it also listens, on a connection of its own, to
``everystep_ended``, which a trigger notifies with the id of a run that
ends (migration 0013) if the run is marked ``awaited`` (migration 0017):
the wait marks it once it listens, then reads again as soon as its run's
id comes, so the end is seen at once, and a lost notification costs one
poll. The runs nobody awaits end without a notification, which
PostgreSQL would make each commit queue for.
"""

import time

from django.db import DEFAULT_DB_ALIAS, connections

from everystep.core import serde
from everystep.db import runs
from everystep.errors import EverystepError
from everystep.models import Workflow
from everystep.resilience import deadline, sessions

POLL_SECONDS = 1.0
CHANNEL = "everystep_ended"


def result(run_id, timeout=None):
    """The run's result once it has ended (`wait`), or what it ended with
    raised: its exception, decoded; `Terminal`; `Cancelled`."""
    status, value, error = wait(run_id, timeout)
    if status == runs.COMPLETED:
        return value
    raise serde.decode_exception(error)


def wait(run_id, timeout=None):
    """``(status, result, error)`` of the run `run_id` once it has ended
    (`Workflow.ENDED`, read by `everystep.db.runs.outcome`). `TimeoutError`
    after `timeout` seconds (None: no limit); `EverystepError` for no such
    run, or for a run that has not ended while this thread is inside
    ``transaction.atomic()`` (which would hide its end, and hold the
    transaction open meanwhile)."""
    give_up = None if timeout is None else time.monotonic() + timeout
    db = connections[DEFAULT_DB_ALIAS]
    listener = _Listener(run_id) if db.vendor == "postgresql" else None
    try:
        while True:
            found = runs.outcome(run_id)
            if found is None:
                raise EverystepError(f"no run {run_id}")
            if found[0] in Workflow.ENDED:
                return found
            if db.in_atomic_block:
                raise EverystepError(
                    f"run {run_id} has not ended, and this wait is inside transaction.atomic(), "
                    f"where its end cannot be seen: wait for it after the transaction"
                )
            left = POLL_SECONDS if give_up is None else give_up - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"run {run_id} had not ended after {timeout} s")
            pause = min(POLL_SECONDS, left)
            if listener is not None:
                listener.wait(pause)
            else:
                time.sleep(pause)
    finally:
        if listener is not None:
            listener.close()


class _Listener:
    """A connection of its own LISTENing to ``everystep_ended`` for one run,
    on the database alias of session-level work
    (`everystep.resilience.sessions.session_alias`). A failure to listen is
    not the wait's: it falls back to polling."""

    def __init__(self, run_id):
        self.run_id = str(run_id)
        self.db = connections.create_connection(sessions.session_alias())
        self.raw = None
        try:
            with deadline.guard(self.db, "listening for the end of a run"):
                self.db.ensure_connection()
                self.raw = self.db.connection
                self.raw.autocommit = True
                self.raw.execute(f"LISTEN {CHANNEL}")
                # Listening first: the run's end, if it comes after this
                # mark, is notified; if before, the wait's next read sees it.
                self.raw.execute(
                    "UPDATE everystep_workflow SET awaited = true WHERE id = %s AND NOT awaited",
                    [run_id],
                )
        except Exception:  # noqa: BLE001 - polling still sees the end
            self.close()

    def wait(self, seconds):
        """Return when the run's end is notified, or after `seconds`."""
        if self.raw is None:
            time.sleep(seconds)
            return
        give_up = time.monotonic() + seconds
        try:
            while (left := give_up - time.monotonic()) > 0:
                for notification in self.raw.notifies(timeout=left):
                    if notification.payload == self.run_id:
                        return
        except Exception:  # noqa: BLE001 - a lost connection: poll from now on
            self.close()

    def close(self):
        try:
            self.db.close()
        except Exception:  # noqa: BLE001 - already broken
            pass
        self.raw = None
