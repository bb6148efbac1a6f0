"""The replay engine: runs one claimed attempt of a workflow body.

A run is executed by calling its body from the top. Each step call is
resolved to a step id; an outcome recorded under that id is served from the
store without calling the function, and only steps never recorded execute
(`everystep.engine.steps`).

How an attempt ends decides the run's state: a return → ``completed``;
`Terminal` → ``stopped``; `EffectUncertain` → ``blocked``; `DrainOrphan` →
back to ``scheduled``; `Sleeping` → ``scheduled``, due at its wake time; `Waiting` → ``scheduled``,
parked until what it waits for comes or its deadline;
any other exception → ``failed``; `SimulatedCrash` → untouched, exactly as
a dead process would leave it.
"""

import threading
import time

from everystep.core import clock, events, registry, serde
from everystep.db import runs, steps
from everystep.engine import context
from everystep.engine.records import end_open_transaction, guarded, lost, move, park
from everystep.errors import (
    Cancelled,
    ClaimLost,
    DrainOrphan,
    EffectUncertain,
    EngineError,
    EverystepError,
    SimulatedCrash,
    Sleeping,
    Terminal,
    Waiting,
)
from everystep.models import Workflow

#: Test hook, None in production: called as ``fault(ctx, step_id, name)``
#: after a step's function returned or raised and before its outcome is
#: written (`everystep.testing.crash_after` sets it).
fault = None

Status = Workflow.Status


def execute(claimed, draining=None):
    """Run one claimed attempt of a workflow to the end of the attempt.

    `claimed` is a `claims.ClaimedRun`; `draining`, a `threading.Event` the
    worker sets to stop new steps. Returns the run's status afterwards —
    ``scheduled`` when it was requeued, ``running`` after a simulated crash —
    or None when the claim was lost to another runner. An error of the
    engine's own (not of the workflow's code) propagates to the caller.
    """
    run = context.RunState(claimed.fence, draining=draining or threading.Event())
    status, error = "crashed", None
    try:
        status = _attempt(claimed, run) or "lost"
        return None if status == "lost" else status
    except BaseException as exc:
        error = exc
        raise
    finally:
        events.announce("attempt_ended", run.fence, status=status, exception=error)


def _attempt(claimed, run):
    fence = run.fence
    started = time.monotonic()
    try:
        if claimed.cancel_requested:  # asked while an earlier claim held it
            raise Cancelled()
        if claimed.has_steps is not False:
            outcomes, attempts_made = guarded(
                lambda attempt: steps.load_outcomes(fence.run_id), "loading steps"
            )
            run.outcomes.update(outcomes)
            run.attempts.update(attempts_made)
        events.announce(
            "attempt_started",
            fence,
            resumed=bool(run.outcomes),
            trace_context=claimed.trace_context,
        )
        body = registry.get(fence.workflow)
        if body is None:  # parked by an earlier deploy that had it
            return _release(fence)
        with context.activated(context.Context(run)):
            try:
                result = body(*claimed.args)
            finally:
                left_open = end_open_transaction()
            if left_open:
                raise EverystepError(
                    "the workflow body left autocommit off (transaction.set_autocommit(False)): "
                    "its open transaction was rolled back; call transaction.set_autocommit(True) "
                    "before the body returns"
                )
        serde.check_size(f"the result of run {fence.run_id}", serde.encode(result))
    except Cancelled as exc:
        # Asked by an operator, it keeps the error the cancel stored; raised
        # by the body (a cancelled child's result), it keeps that one.
        asked = run.cancel_asked or claimed.cancel_requested
        return _end_cancelled(fence, started, None if asked else serde.encode_exception(exc))
    except Terminal as exc:
        return _finish(fence, Status.STOPPED, started, error=serde.encode_exception(exc))
    except EffectUncertain as exc:
        return _finish(fence, Status.BLOCKED, started, error=serde.encode_exception(exc))
    except Waiting as exc:
        if run.cancel_asked:
            return _end_cancelled(fence, started)
        if not park(fence, exc):
            return lost(fence)
        events.announce(
            "run_waiting",
            fence,
            step_id=exc.step_id,
            wake_at="no deadline" if exc.wake_at == clock.FOREVER else exc.wake_at,
            waits_for=f"a message on {exc.topic}" if exc.topic else f"run {exc.awaited}",
        )
        return Status.SCHEDULED
    except Sleeping as exc:
        if run.cancel_asked:  # learnt as it recorded the sleep: it sleeps no more
            return _end_cancelled(fence, started)
        if not move(fence, Status.SCHEDULED, "putting to sleep", run_at=exc.wake_at):
            return lost(fence)
        events.announce("run_sleeping", fence, step_id=exc.step_id, wake_at=exc.wake_at)
        return Status.SCHEDULED
    except DrainOrphan:
        if not move(fence, Status.SCHEDULED, "requeuing"):
            return lost(fence)
        reason = f"at a step boundary: worker {fence.worker} is draining"
        events.announce("run_requeued", fence, reason=reason)
        return Status.SCHEDULED
    except SimulatedCrash:
        return Status.RUNNING
    except ClaimLost:
        return lost(fence)
    except EngineError as exc:
        raise exc.error from None
    except Exception as exc:
        error = serde.encode_exception(exc)
        return _finish(fence, Status.FAILED, started, error=error, exception=exc)
    return _finish(fence, Status.COMPLETED, started, result=result, error=None)


def fail_crashed(claimed, exc, should_stop=None):
    """Mark a claimed run that died outside the runner (an error of the
    engine's own) ``failed`` with the encoded exception. Returns whether it
    landed; raises the last database error if `should_stop` gives up."""
    fence = claimed.fence
    if not move(fence, Status.FAILED, "failing", should_stop, error=serde.encode_exception(exc)):
        return False
    events.announce(
        "run_crashed", fence, exc_info=(type(exc), exc, exc.__traceback__), exception=exc
    )
    return True


def requeue_claimed(claimed, should_stop=None):
    """Put a claimed run back to ``scheduled`` (the drain deadline passed
    with its step still running). Returns whether it landed."""
    if not move(claimed.fence, Status.SCHEDULED, "requeuing", should_stop):
        return False
    reason = "at the drain deadline while its step was still running"
    events.announce("run_requeued", claimed.fence, reason=reason)
    return True


def _finish(fence, status, started, *, exception=None, **fields):
    """End the run in `status`, writing `fields` (its result, its error)
    too; a cancelled run keeps the error its cancel stored."""
    if not move(fence, status, "finishing", **fields):
        return lost(fence)
    error = fields.get("error")
    events.announce(
        f"run_{status}",
        fence,
        # A failure's log line carries its traceback.
        exc_info=exception if status == Status.FAILED else None,
        exception=exception,
        status=status,
        millis=(time.monotonic() - started) * 1000,
        reason=f": {error['type']}: {error['message']}" if error else "",
    )
    return status


def _end_cancelled(fence, started, error=None):
    """End the run ``cancelled`` (with `error`, if given), and the runs it
    started that have not ended: a child started by the step in flight when
    the cancel came."""
    status = _finish(fence, Status.CANCELLED, started, **({"error": error} if error else {}))
    if status == Status.CANCELLED:
        guarded(lambda attempt: runs.cancel_descendants(fence.run_id), "cancelling children")
    return status


def _release(fence):
    """Give back a run of a workflow this process does not have."""
    if not move(fence, Status.SCHEDULED, "releasing"):
        return lost(fence)
    events.announce("run_released", fence)
    return Status.SCHEDULED
