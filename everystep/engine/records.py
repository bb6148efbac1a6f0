"""The engine's own writes from inside an attempt: retried through outages,
fenced on the claim, and kept out of the reach of workflow code.

`guarded` runs one database operation for the runner: transient errors are
retried (`everystep.resilience.transient`), a value too large for the
database fails the run like any value that cannot be stored, and any other
error is wrapped in `EngineError` so that a workflow's ``except Exception``
cannot swallow it. `move` is the one way an attempt takes its run out of
``running``; `lost` says why a fenced write was refused. The engine's
records must commit when they are written, whatever the workflow's code
does: `open_transaction` tells a transaction that code left open (it turned
autocommit off), and `end_open_transaction` rolls it back.
"""

from everystep.core import events
from everystep.db import runs
from everystep.errors import EngineError, EverystepError
from everystep.resilience import classify, local, transient


def guarded(operation, what):
    """Run ``operation(attempt)`` from inside a workflow body: retried through
    transient errors; `EverystepError` when the database refuses a value as
    too large; any other error wrapped in `EngineError`."""
    try:
        return transient.retrying(operation, what=what)
    except Exception as exc:
        if classify.is_too_large(exc):
            raise EverystepError(
                f"the database cannot store this while {what}: {classify.one_line(exc)}"
            ) from exc
        raise EngineError(exc) from exc


def move(fence, status, verb, should_stop=None, **fields):
    """Move the run held under `fence` out of ``running`` to `status`,
    writing `fields` too; retried through outages, and after a lost reply a
    retry reads back whether the move had landed. Returns whether it did."""

    def write(attempt):
        if runs.move_claimed(fence, status, **fields):
            return True
        return attempt > 1 and runs.has_moved(fence, status)

    return transient.retrying(write, what=f"{verb} run {fence.run_id}", should_stop=should_stop)


def park(fence, waiting):
    """Park the run held under `fence` for what `waiting` (a `Waiting`)
    waits for (`everystep.db.runs.park`), retried as `move` is. Returns
    whether it landed."""

    def write(attempt):
        parked = runs.park(fence, waiting.wake_at, topic=waiting.topic, awaited=waiting.awaited)
        return parked or (attempt > 1 and runs.has_moved(fence, runs.SCHEDULED))

    return transient.retrying(write, what=f"parking run {fence.run_id}")


def lost(fence):
    """Announce why this attempt's writes were refused: the run's row is
    gone, or another runner owns it now. Returns None."""
    try:
        vanished = not runs.run_exists(fence.run_id)
    except Exception:  # noqa: BLE001 - only the wording of the log depends on it
        vanished = False
    events.announce("run_vanished" if vanished else "claim_lost", fence)
    return None


def open_transaction(db):
    """Whether the connection `db` is in a transaction that workflow code
    opened by turning autocommit off (``transaction.set_autocommit(False)``)
    outside any atomic block: a record written there would be lost with it."""
    # Read as attributes: this runs twice for every step.
    return db.connection is not None and not db.in_atomic_block and not db.autocommit


def end_open_transaction():
    """Roll back the transaction workflow code left open on this thread's
    connection, and turn autocommit back on. Returns whether there was one."""
    db = local.connection()
    if not open_transaction(db):
        return False
    try:
        db.rollback()
        db.set_autocommit(True)
    except Exception:  # noqa: BLE001 - a broken connection: the next write opens another
        db.close()
    return True
