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
back to ``scheduled``; `Sleeping` → ``scheduled``, due at its wake time;
any other exception → ``failed``; `SimulatedCrash` → untouched, exactly as
a dead process would leave it.
"""

import dataclasses
import datetime
import logging
import threading
import time

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.utils import timezone

from everystep.core import clock, events, registry, retry_policy, serde
from everystep.db import store
from everystep.engine import context
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
    WorkflowCodeError,
)
from everystep.models import Step, Workflow
from everystep.resilience import classify, transient

logger = logging.getLogger(__name__)

#: Test hook, None in production: called as ``fault(ctx, step_id, name)``
#: after a step's function returned or raised and before its outcome is
#: written (`everystep.testing.crash_after` sets it).
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
    status, error = "crashed", None
    try:
        status = _attempt(claimed, run) or "lost"
        return None if status == "lost" else status
    except BaseException as exc:
        error = exc
        raise
    finally:
        events.announce(
            "attempt_ended",
            run_id=run.workflow_id,
            workflow=run.workflow_name,
            worker=run.worker,
            status=status,
            exception=error,
        )


def _attempt(claimed, run):
    started = time.monotonic()
    try:
        if claimed.cancel_requested:  # asked while an earlier claim held it
            raise Cancelled()
        if claimed.has_steps is not False:
            outcomes, attempts_made = _guarded(
                lambda attempt: store.load_outcomes(run.workflow_id), "loading steps"
            )
            run.outcomes.update(outcomes)
            run.attempts.update(attempts_made)
        events.announce(
            "attempt_started",
            run_id=run.workflow_id,
            workflow=run.workflow_name,
            worker=run.worker,
            resumed=bool(run.outcomes),
            trace_context=claimed.trace_context,
        )
        body = registry.get(run.workflow_name)
        if body is None:  # parked by an earlier deploy that had it
            return _release(run)
        with context.activated(context.Context(run)):
            result = body(*claimed.args)
        serde.check_size(f"the result of run {run.workflow_id}", serde.encode(result))
    except Cancelled:
        return _finish(run, Status.CANCELLED, started)
    except Terminal as exc:
        return _finish(run, Status.STOPPED, started, error=serde.encode_exception(exc))
    except EffectUncertain as exc:
        return _finish(run, Status.BLOCKED, started, error=serde.encode_exception(exc))
    except Sleeping as exc:
        if run.cancel_asked:  # learnt as it recorded the sleep: it sleeps no more
            return _finish(run, Status.CANCELLED, started)
        if not _move(run, Status.SCHEDULED, "putting to sleep", run_at=exc.wake_at):
            return _lost(run)
        events.announce(
            "run_sleeping",
            run_id=run.workflow_id,
            workflow=run.workflow_name,
            worker=run.worker,
            step_id=exc.step_id,
            wake_at=exc.wake_at,
        )
        return Status.SCHEDULED
    except DrainOrphan:
        if not _move(run, Status.SCHEDULED, "requeuing"):
            return _lost(run)
        reason = f"at a step boundary: worker {run.worker} is draining"
        events.announce("run_requeued", run_id=run.workflow_id, worker=run.worker, reason=reason)
        return Status.SCHEDULED
    except SimulatedCrash:
        return Status.RUNNING
    except ClaimLost:
        return _lost(run)
    except EngineError as exc:
        raise exc.error from None
    except Exception as exc:
        error = serde.encode_exception(exc)
        return _finish(run, Status.FAILED, started, error=error, exception=exc)
    return _finish(run, Status.COMPLETED, started, result=result, error=None)


def run_step(ctx, step_id, name, func, args, kwargs, unsafe_to_repeat, policy=None):
    """Execute or replay one step call of the running workflow `ctx`;
    `policy` (`everystep.core.retry_policy.RetryPolicy`) calls it again after
    the errors it names."""
    run = ctx.run
    recorded = run.outcomes.get(step_id)
    attempt = 1
    row = None  # the status of this step's row, when one is to be updated in place
    last_error = None  # the error of the last failed call that was retried (JSON text)
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
        if recorded["status"] == Step.Status.RETRYING:
            if clock.now() < recorded["result"]:
                raise Sleeping(run.workflow_id, step_id, recorded["result"])
            attempt = run.attempts[step_id] + 1
            last_error = serde.dumps(recorded["error"])
        elif unsafe_to_repeat:
            raise EffectUncertain(run.workflow_id, step_id)
        # A retry that is due, or a started step now safe to repeat: run it
        # again and update its row.
        row = recorded["status"]
    if run.cancel_asked:  # learnt by a sibling branch's write: no new step starts
        raise Cancelled()
    if ctx.draining:
        raise DrainOrphan(run.workflow_id, step_id)

    step = {"step_id": step_id, "name": name, "started_at": timezone.now()}
    step["args"] = serde.dumps(serde.to_json(list(args)))
    step["kwargs"] = serde.dumps(serde.to_json(kwargs))
    serde.check_size(f"the arguments of step {step_id}", step["args"], step["kwargs"])
    try:
        while True:
            if unsafe_to_repeat and row != Step.Status.STARTED:
                # Its effect is claimed before each call: a crash during the
                # call leaves it started, and the run blocked.
                _record(run, step, Step.Status.STARTED, None, None, replacing=row, attempts=attempt)
                row = Step.Status.STARTED
            outcome = _call(ctx, step, func, args, kwargs)
            error = outcome.error
            retrying = policy is not None and policy.retries_after(error, attempt)
            if fault is not None:
                fault(ctx, step_id, name)
            if not retrying:
                break
            wait = policy.wait(attempt)
            retry_at = clock.now() + datetime.timedelta(seconds=wait)
            retry_at_text = serde.dumps(serde.to_json(retry_at))
            last_error = outcome.error_text
            _announce_retry(run, step, attempt, policy, error, wait)
            durable = wait > retry_policy.IN_PLACE_SECONDS or ctx.draining
            # Waiting durably, or after an unsafe step whose outcome is known
            # (it failed, and may run again): the wait is recorded.
            if durable or unsafe_to_repeat:
                _record(
                    run,
                    step,
                    Step.Status.RETRYING,
                    retry_at_text,
                    outcome.error_text,
                    replacing=row,
                    attempts=attempt,
                )
                row = Step.Status.RETRYING
                _stop_if_cancel_asked(run)
            if durable:
                run.outcomes[step_id] = {
                    "name": name,
                    "status": Step.Status.RETRYING,
                    "result": retry_at,
                    "error": outcome.encoded_error,
                }
                run.attempts[step_id] = attempt
                raise Sleeping(run.workflow_id, step_id, retry_at)
            time.sleep(wait)
            attempt += 1

        _record(
            run,
            step,
            outcome.status,
            outcome.result_text,
            outcome.error_text or last_error,
            replacing=row,
            attempts=attempt,
        )
    except BaseException as exc:
        # A call that ran but was not recorded: a crash, a lost claim, an
        # outcome that cannot be stored, a retry's durable wait.
        # Subscribers close what they opened.
        events.announce("step_unrecorded", run_id=run.workflow_id, step_id=step_id, exception=exc)
        raise
    events.announce(
        "step_recorded",
        run_id=run.workflow_id,
        workflow=run.workflow_name,
        worker=run.worker,
        step_id=step_id,
        step=name,
        status=outcome.status,
        seconds=outcome.seconds,
        exception=error,
    )
    run.outcomes[step_id] = {
        "name": name,
        "status": outcome.status,
        "result": outcome.result,
        "error": outcome.encoded_error,
    }
    _stop_if_cancel_asked(run)
    if error is not None:
        raise error
    return outcome.result


def _stop_if_cancel_asked(run):
    """After a write that landed despite a cancel asked of the run: stop."""
    if run.cancel_asked:
        raise Cancelled()


@dataclasses.dataclass(frozen=True)
class _Outcome:
    """What one call of a step's function gave, decoded and as JSON text."""

    status: str
    result: object
    error: Exception | None
    encoded_error: dict | None
    result_text: str | None
    error_text: str | None
    seconds: float


def _call(ctx, step, func, args, kwargs):
    """Call a step's function once, as §3 orders it: announced, outside the
    recording, its outcome checked for size."""
    run, step_id = ctx.run, step["step_id"]
    if events.wanted("step_started"):  # for spans and the DEBUG log: skipped if neither wants it
        events.announce(
            "step_started",
            run_id=run.workflow_id,
            workflow=run.workflow_name,
            step_id=step_id,
            step=step["name"],
        )
    outcome = _called(ctx, func, args, kwargs)
    serde.check_size(
        f"the outcome of step {step_id}",
        step["args"],
        step["kwargs"],
        outcome.result_text,
        outcome.error_text,
    )
    return outcome


def _called(ctx, func, args, kwargs):
    ctx.recording = False  # what the function calls is part of this step
    began = time.monotonic()
    try:
        if context.host_transaction() is None:
            result = func(*args, **kwargs)
        else:
            # In a test's transaction a worker's autocommit is a savepoint:
            # a step that fails on a database error rolls back its own
            # writes, and the test's transaction stays usable to record it.
            with transaction.atomic():
                result = func(*args, **kwargs)
    except Exception as exc:
        encoded = serde.encode_exception(exc)
        seconds = time.monotonic() - began
        return _Outcome(Step.Status.FAILED, None, exc, encoded, None, serde.dumps(encoded), seconds)
    finally:
        ctx.recording = True
    seconds = time.monotonic() - began
    text = serde.dumps(serde.to_json(result))
    return _Outcome(Step.Status.DONE, result, None, None, text, None, seconds)


def _announce_retry(run, step, attempt, policy, error, wait):
    events.announce(
        "step_retrying",
        run_id=run.workflow_id,
        workflow=run.workflow_name,
        worker=run.worker,
        step_id=step["step_id"],
        step=step["name"],
        attempt=attempt,
        attempts=policy.retries + 1,
        error=classify.one_line(error),
        exception=error,
        seconds=wait,
    )


#: The name a durable sleep is recorded under.
SLEEP = "everystep.sleep"


def sleep(ctx, step_id, seconds):
    """A durable sleep of the running workflow `ctx` at `step_id`: its wake
    time is recorded first (a step whose result is that time), then the run
    leaves with `Sleeping` unless the time has passed. A crash in between
    loses nothing: the attempt that resumes finds the step and sleeps on to
    the same wake time."""
    run = ctx.run
    recorded = run.outcomes.get(step_id)
    if recorded is not None and recorded["name"] != SLEEP:
        raise WorkflowCodeError(
            f"run {run.workflow_id} recorded step {step_id} as {recorded['name']}, "
            f"but the workflow now sleeps there: its code changed under a run in flight"
        )
    if recorded is None:
        started = clock.now()
        wake_at = started + datetime.timedelta(seconds=seconds)
        step = {"step_id": step_id, "name": SLEEP, "started_at": started}
        step["args"] = serde.dumps(serde.to_json([seconds]))
        step["kwargs"] = serde.dumps(serde.to_json({}))
        _record(run, step, Step.Status.DONE, serde.dumps(serde.to_json(wake_at)), None)
        recorded = {"name": SLEEP, "status": Step.Status.DONE, "result": wake_at, "error": None}
        run.outcomes[step_id] = recorded
        _stop_if_cancel_asked(run)
    wake_at = recorded["result"]
    if clock.now() < wake_at:
        raise Sleeping(run.workflow_id, step_id, wake_at)


def refuse_inside_transaction(what):
    """Raise `EverystepError` when this thread is inside ``transaction.atomic()``
    on any database: a step's record (or its effect) would ride the body's
    transaction, and a rollback would lose one without the other."""
    if len(connections.settings) == 1:
        databases = (connections[DEFAULT_DB_ALIAS],)
    else:
        databases = connections.all(initialized_only=True)
    host = context.host_transaction()
    for db in databases:
        hosted = host.depths.get(db.alias, 0) if host is not None else 0
        if db.in_atomic_block and len(db.atomic_blocks) > hosted:
            raise EverystepError(
                f"{what} was called inside transaction.atomic() (database {db.alias!r}) "
                f"in a workflow body: move the atomic block into the step's function, "
                f"so the step's effect and its record cannot be split by a rollback"
            )


def _record(run, step, status, result, error, *, replacing=None, attempts=1):
    """Write a step's outcome (or its ``started`` or ``retrying`` row):
    a new row, or in place of its row in status `replacing`; fenced and
    retried. A retry after a lost reply finds out whether the first write
    had landed.

    A write refused because a cancel was asked of the run: an outcome is
    written all the same (the step in flight is recorded) and the run is
    marked to stop (`RunState.cancel_asked`); a ``started`` row, which
    would begin a new step, is not, and `Cancelled` is raised. Any other
    refusal raises `ClaimLost`: the run is no longer this runner's."""
    step_id = step["step_id"]

    def write(attempt, despite_cancel=False):
        if replacing is not None:
            landed = store.update_step(
                run, step_id, replacing, status, result, error, attempts, despite_cancel
            )
        else:
            landed = store.record_step(
                run,
                status=status,
                result=result,
                error=error,
                attempts=attempts,
                despite_cancel=despite_cancel,
                **step,
            )
        if not landed and attempt > 1:
            return store.step_recorded(run, step_id, status)
        return bool(landed)

    what = f"recording step {step_id} of run {run.workflow_id}"
    if _guarded(write, what):
        return
    if not _guarded(lambda attempt: store.cancel_asked(run), f"reading run {run.workflow_id}"):
        raise ClaimLost(run.workflow_id, step_id)
    if status == Step.Status.STARTED:
        raise Cancelled()
    if not _guarded(lambda attempt: write(attempt, despite_cancel=True), what):
        raise ClaimLost(run.workflow_id, step_id)
    run.cancel_asked = True


def fail_crashed(claimed, exc, should_stop=None):
    """Mark a claimed run that died outside the runner (an error of the
    engine's own) ``failed`` with the encoded exception. Returns whether it
    landed; raises the last database error if `should_stop` gives up."""
    run = context.RunState(claimed.id, claimed.name, claimed.claim_token, claimed.claimed_by)
    if not _move(run, Status.FAILED, "failing", should_stop, error=serde.encode_exception(exc)):
        return False
    events.announce(
        "run_crashed",
        exc_info=(type(exc), exc, exc.__traceback__),
        exception=exc,
        run_id=run.workflow_id,
        workflow=run.workflow_name,
        worker=run.worker,
    )
    return True


def requeue_claimed(claimed, should_stop=None):
    """Put a claimed run back to ``scheduled`` (the drain deadline passed
    with its step still running). Returns whether it landed."""
    run = context.RunState(claimed.id, claimed.name, claimed.claim_token, claimed.claimed_by)
    if not _move(run, Status.SCHEDULED, "requeuing", should_stop):
        return False
    reason = "at the drain deadline while its step was still running"
    events.announce("run_requeued", run_id=run.workflow_id, worker=run.worker, reason=reason)
    return True


def _finish(run, status, started, *, exception=None, **fields):
    """End the run in `status`, writing `fields` (its result, its error)
    too; a cancelled run keeps the error its cancel stored."""
    if not _move(run, status, "finishing", **fields):
        return _lost(run)
    error = fields.get("error")
    events.announce(
        f"run_{status}",
        # A failure's log line carries its traceback.
        exc_info=exception if status == Status.FAILED else None,
        exception=exception,
        run_id=run.workflow_id,
        workflow=run.workflow_name,
        worker=run.worker,
        status=status,
        millis=(time.monotonic() - started) * 1000,
        reason=f": {error['type']}: {error['message']}" if error else "",
    )
    return status


def _release(run):
    """Give back a run of a workflow this process does not have."""
    if not _move(run, Status.SCHEDULED, "releasing"):
        return _lost(run)
    events.announce(
        "run_released", run_id=run.workflow_id, workflow=run.workflow_name, worker=run.worker
    )
    return Status.SCHEDULED


def _move(run, status, verb, should_stop=None, **fields):
    """The one way an attempt moves its run out of ``running``: fenced on its
    claim, retried through outages; after a lost reply, a retry reads back
    whether the move had landed. Returns whether it did."""

    def write(attempt):
        if store.move_claimed(run, status, **fields):
            return True
        return attempt > 1 and store.has_moved(run, status)

    return transient.retrying(write, what=f"{verb} run {run.workflow_id}", should_stop=should_stop)


def _lost(run):
    """Announce why this attempt's writes were refused: the run's row is
    gone, or another runner owns it now. Returns None."""
    try:
        vanished = not store.run_exists(run.workflow_id)
    except Exception:  # noqa: BLE001 - only the wording of the log depends on it
        vanished = False
    events.announce("run_vanished" if vanished else "claim_lost", run_id=run.workflow_id)
    return None


def _guarded(operation, what):
    """Run one of the engine's own database operations from inside a workflow
    body: transient errors are retried; a value the database refuses as too
    large fails the run like any unstorable value (`EverystepError`); any
    other error is wrapped so that workflow code cannot swallow it."""
    try:
        return transient.retrying(operation, what=what)
    except Exception as exc:
        if classify.is_too_large(exc):
            raise EverystepError(
                f"the database cannot store this while {what}: {classify.one_line(exc)}"
            ) from exc
        raise EngineError(exc) from exc
