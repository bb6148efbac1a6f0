"""What a worker shows of itself: its row in the workers table (state,
heartbeat, runs in flight) and its probes (``/healthz``, ``/readyz``).

Both read one state: ``starting`` until the worker has caught up, then
``ready``; ``outage`` while the database is out of reach; ``draining`` once
asked to stop. The heartbeat is refreshed by the name guard's thread with
each check of the lock — never per step — and the probes read the state
without a query of their own.
"""

import time

from django.db import DEFAULT_DB_ALIAS, connections

from everystep.db import workers
from everystep.models import Worker as WorkerRow
from everystep.resilience import deadline, outage, transient

State = WorkerRow.State


class Presence:
    """The state of the worker named in `options`, whose runs in flight are
    in `pool`."""

    def __init__(self, options, pool):
        self._options = options
        self._pool = pool
        self.ready = False  # caught up and looping
        self._next_turn_at = None  # when the loop's next turn is due (monotonic)

    def state(self):
        """The state the workers table shows for this worker now."""
        if self._pool.draining.is_set():
            return State.DRAINING
        if not self.ready:
            return State.STARTING
        if outage.tracker.since is not None:
            return State.OUTAGE
        return State.READY

    def turn_due_in(self, seconds):
        """The loop's next turn is due in `seconds` (0: it is turning now)."""
        self._next_turn_at = time.monotonic() + seconds

    def heartbeat(self, lock_connection):
        """Refresh the worker's row; called by the name guard after each
        check of the lock, with the lock's own connection (None for a file
        lock)."""
        db = lock_connection or connections[DEFAULT_DB_ALIAS]
        with deadline.guard(db, "refreshing the heartbeat"):
            workers.heartbeat(
                self._options.name, self.state(), len(self._pool.in_flight), using=lock_connection
            )

    def report(self, state):
        """Best effort: record `state` now, unless the database is known to
        be away (the heartbeat catches up later)."""
        if outage.tracker.since is not None:
            return
        try:
            with deadline.guard(connections[DEFAULT_DB_ALIAS], f"recording state {state}"):
                workers.heartbeat(self._options.name, state, len(self._pool.in_flight))
        except Exception as exc:  # noqa: BLE001 - only the workers list shows it
            transient.drop_after(exc)

    def health(self, name_held):
        """``(alive, ready, reason)`` for the probes (`everystep.worker.endpoint`):
        alive while the loop turns (a wedged one is late for its next turn,
        backoff included, by more than 3 polls plus the database deadline);
        ready in the ``ready`` state while the name is held (`name_held`)."""
        due = self._next_turn_at
        if due is not None:
            late = time.monotonic() - due
            if late > 3 * self._options.poll + self._options.db_deadline:
                return False, False, f"the worker loop is {late:.0f}s late for its next turn"
        state = self.state()
        if state != State.READY:
            return True, False, _NOT_READY[state]
        if not name_held:
            return True, False, "the lock on the worker name is being taken again"
        return True, True, "ready"


_NOT_READY = {
    State.DRAINING: "draining",
    State.STARTING: "starting",
    State.OUTAGE: "database unreachable",
}
