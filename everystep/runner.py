"""The replay engine: runs a claimed workflow body, recording every step.

A run is executed by calling its body from the top. Each step call is
resolved to a step id; an outcome recorded under that id is served from the
store without calling the function, and only steps never recorded execute.
The order of a new step is fixed (§3 of the contract): validate arguments,
insert a ``started`` row for an unsafe-to-repeat step, call the function,
validate the result, call `fault`, then record the outcome. A process that
dies anywhere in between leaves the step unrecorded, so it runs again on
resume — or, when it is unsafe to repeat, the run ends ``blocked``.

How an attempt ends decides the run's state: a return → ``completed``;
`Terminal` → ``stopped``; `EffectUncertain` → ``blocked``; `DrainOrphan` →
back to ``scheduled``; any other exception → ``failed``; `SimulatedCrash` →
untouched, exactly as a dead process would leave it.
"""

import logging
import threading
import time

from django.db import connections
from django.utils import timezone

from everystep import context, registry, retry, serde, store
from everystep.errors import (
    ClaimLost,
    DrainOrphan,
    EffectUncertain,
    EngineError,
    EverystepError,
    SimulatedCrash,
    Terminal,
    WorkflowCodeError,
)
from everystep.models import Step, Workflow

logger = logging.getLogger(__name__)

#: Test hook, None in production: called as ``fault(ctx, step_id)`` after a
#: step's function returned or raised and before its outcome is written.
fault = None

Status = Workflow.Status


def execute(claimed, draining=None):
    """Run one claimed attempt of a workflow to the end of the attempt.

    `claimed` is a `store.ClaimedRun`; `draining`, a `threading.Event` the
    worker sets to stop new steps. Returns the run's status afterwards —
    ``scheduled`` when it was requeued, ``running`` after a simulated crash —
    or None when the claim was lost to another runner. An error of the
    engine's own (not of the workflow's code) propagates to the caller.
    """
    run = context.RunState(
        claimed.id,
        claimed.name,
        claimed.claim_token,
        worker=claimed.claimed_by,
        draining=draining or threading.Event(),
    )
    started = time.monotonic()
    try:
        if claimed.has_steps is not False:
            run.outcomes.update(
                _guarded(lambda attempt: store.load_outcomes(run.workflow_id), "loading steps")
            )
        body = registry.get(run.workflow_name)
        if body is None:
            raise EverystepError(
                f"workflow {run.workflow_name} is not registered in this worker: "
                f"import the module that defines it"
            )
        with context.activated(context.Context(run)):
            result = body(*claimed.args)
        serde.check_size(f"the result of run {run.workflow_id}", serde.encode(result))
    except Terminal as exc:
        return _finish(run, Status.STOPPED, started, error=serde.encode_exception(exc))
    except EffectUncertain as exc:
        logger.warning("run %s blocked: %s", run.workflow_id, exc, extra={"action": "run_blocked"})
        return _finish(run, Status.BLOCKED, started, error=serde.encode_exception(exc))
    except DrainOrphan:
        return _requeue(run)
    except SimulatedCrash:
        return Status.RUNNING
    except ClaimLost:
        return _lost(run)
    except EngineError as exc:
        raise exc.error from None
    except Exception as exc:
        return _finish(run, Status.FAILED, started, error=serde.encode_exception(exc))
    return _finish(run, Status.COMPLETED, started, result=result)


def run_step(ctx, step_id, name, func, args, kwargs, unsafe_to_repeat):
    """Execute or replay one step call of the running workflow `ctx`."""
    run = ctx.run
    recorded = run.outcomes.get(step_id)
    rerun_started = False
    if recorded is not None:
        if recorded["name"] != name:
            raise WorkflowCodeError(
                f"run {run.workflow_id} recorded step {step_id} as {recorded['name']}, "
                f"but the workflow now calls {name} there: its code changed under a run "
                f"in flight"
            )
        if recorded["status"] == Step.Status.DONE:
            return recorded["result"]
        if recorded["status"] == Step.Status.FAILED:
            raise serde.decode_exception(recorded["error"])
        if unsafe_to_repeat:
            raise EffectUncertain(run.workflow_id, step_id)
        rerun_started = True  # now safe to repeat: run it again, complete its row
    if ctx.draining:
        raise DrainOrphan(run.workflow_id, step_id)

    step = {"step_id": step_id, "name": name, "started_at": timezone.now()}
    step["args"] = serde.dumps(serde.to_json(list(args)))
    step["kwargs"] = serde.dumps(serde.to_json(kwargs))
    serde.check_size(f"the arguments of step {step_id}", step["args"], step["kwargs"])
    if unsafe_to_repeat:
        _record(run, step, Step.Status.STARTED, None, None, update=False)

    ctx.recording = False  # what the function calls is part of this step
    try:
        result = func(*args, **kwargs)
    except Exception as exc:
        error, status, result = exc, Step.Status.FAILED, None
        encoded_error = serde.encode_exception(exc)
        result_text, error_text = None, serde.dumps(encoded_error)
    else:
        error, status, encoded_error = None, Step.Status.DONE, None
        result_text, error_text = serde.dumps(serde.to_json(result)), None
    finally:
        ctx.recording = True
    serde.check_size(
        f"the outcome of step {step_id}", step["args"], step["kwargs"], result_text, error_text
    )

    if fault is not None:
        fault(ctx, step_id)
    _record(run, step, status, result_text, error_text, update=unsafe_to_repeat or rerun_started)
    run.outcomes[step_id] = {
        "name": name,
        "status": status,
        "result": result,
        "error": encoded_error,
    }
    if error is not None:
        raise error
    return result


def refuse_inside_transaction(what):
    """Raise `EverystepError` when this thread is inside ``transaction.atomic()``
    on any database: a step's record (or its effect) would ride the body's
    transaction, and a rollback would lose one without the other."""
    for db in connections.all(initialized_only=True):
        if db.in_atomic_block:
            raise EverystepError(
                f"{what} was called inside transaction.atomic() (database {db.alias!r}) "
                f"in a workflow body: move the atomic block into the step's function, "
                f"so the step's effect and its record cannot be split by a rollback"
            )


def _record(run, step, status, result, error, *, update):
    """Write a step's outcome (or its ``started`` row), fenced and retried;
    raise `ClaimLost` if the run is no longer this runner's."""

    def write(attempt):
        if update:
            return store.complete_started_step(run, step["step_id"], status, result, error)
        landed = store.record_step(run, status=status, result=result, error=error, **step)
        if landed is None:  # the row is there: ours if this is a retry
            return attempt > 1
        return landed

    if not _guarded(write, f"recording step {step['step_id']} of run {run.workflow_id}"):
        raise ClaimLost(run.workflow_id, step["step_id"])


def _finish(run, status, started, *, result=None, error=None):
    landed = retry.retrying(
        lambda attempt: store.finish_run(run, status, result=result, error=error),
        what=f"finishing run {run.workflow_id}",
    )
    if not landed:
        return _lost(run)
    log = logger.info if status == Status.COMPLETED else logger.warning
    log(
        "run %s %s %s in %.0f ms%s",
        run.workflow_id,
        run.workflow_name,
        status,
        (time.monotonic() - started) * 1000,
        f": {error['type']}: {error['message']}" if error else "",
        extra={"action": f"run_{status}", "run_id": str(run.workflow_id), "worker": run.worker},
    )
    return status


def _requeue(run):
    requeued = retry.retrying(
        lambda attempt: store.requeue_run(run), what=f"requeuing run {run.workflow_id}"
    )
    if not requeued:
        return _lost(run)
    logger.info(
        "run %s requeued at a step boundary: worker %s is draining",
        run.workflow_id,
        run.worker,
        extra={"action": "run_requeued", "run_id": str(run.workflow_id), "worker": run.worker},
    )
    return Status.SCHEDULED


def _lost(run):
    """Log why this attempt's writes were refused: the run's row is gone, or
    another runner owns it now. Returns None."""
    try:
        vanished = not store.run_exists(run.workflow_id)
    except Exception:  # noqa: BLE001 - only the wording of the log depends on it
        vanished = False
    if vanished:
        logger.warning(
            "run %s vanished while it ran (its row was deleted); skipped",
            run.workflow_id,
            extra={"action": "run_vanished", "run_id": str(run.workflow_id)},
        )
    else:
        logger.warning(
            "run %s: this runner lost its claim (requeued or claimed elsewhere); "
            "its late writes were dropped",
            run.workflow_id,
            extra={"action": "claim_lost", "run_id": str(run.workflow_id)},
        )
    return None


def _guarded(operation, what):
    """Run one of the engine's own database operations from inside a workflow
    body: transient errors are retried; any other error is wrapped so that
    workflow code cannot swallow it."""
    try:
        return retry.retrying(operation, what=what)
    except Exception as exc:
        raise EngineError(exc) from exc
