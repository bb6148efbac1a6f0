"""The engine's own writes from inside an attempt: retried through outages,
fenced on the claim, and kept out of the reach of workflow code.

`guarded` runs one database operation for the runner: transient errors are
retried (`everystep.resilience.transient`), a value too large for the
database fails the run like any value that cannot be stored, and any other
error is wrapped in `EngineError` so that a workflow's ``except Exception``
cannot swallow it. `move` is the one way an attempt takes its run out of
``running``; `lost` says why a fenced write was refused.
"""

from everystep.core import events
from everystep.db import runs
from everystep.errors import EngineError, EverystepError
from everystep.resilience import classify, transient


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


def lost(fence):
    """Announce why this attempt's writes were refused: the run's row is
    gone, or another runner owns it now. Returns None."""
    try:
        vanished = not runs.run_exists(fence.run_id)
    except Exception:  # noqa: BLE001 - only the wording of the log depends on it
        vanished = False
    events.announce("run_vanished" if vanished else "claim_lost", fence)
    return None
