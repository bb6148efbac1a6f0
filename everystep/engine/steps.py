"""Steps: executing or replaying one step call of a running workflow, and
recording its outcome.

The order of a new step is fixed (§3 of the contract): validate arguments,
insert a ``started`` row for an unsafe-to-repeat step, call the function,
validate the result, call the test hook `everystep.engine.runner.fault`,
then record the outcome. A process that dies anywhere in between leaves the
step unrecorded, so it runs again on resume — or, when it is unsafe to
repeat, the run ends ``blocked``. A durable sleep (`sleep`) is a step whose
result is its wake time.
"""

import datetime
import time
import typing

from django.db import connections, transaction
from django.utils import timezone

from everystep.core import clock, events, retry_policy, serde
from everystep.db import runs, steps
from everystep.engine import context, records, runner
from everystep.errors import (
    Cancelled,
    ClaimLost,
    DrainOrphan,
    EffectUncertain,
    EverystepError,
    Sleeping,
    WorkflowCodeError,
)
from everystep.models import Step
from everystep.resilience import classify, local


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
        check_recorded_as(run, step_id, recorded, name)
        if recorded["status"] == Step.Status.DONE:
            return recorded["result"]
        if recorded["status"] == Step.Status.FAILED:
            raise serde.decode_exception(recorded["error"])
        if recorded["status"] == Step.Status.RETRYING:
            if clock.now() < recorded["result"]:
                raise Sleeping(run.fence.run_id, step_id, recorded["result"])
            attempt = run.attempts[step_id] + 1
            last_error = serde.dumps(recorded["error"])
        elif unsafe_to_repeat:
            raise EffectUncertain(run.fence.run_id, step_id)
        # A retry that is due, or a started step now safe to repeat: run it
        # again and update its row.
        row = recorded["status"]
    if run.cancel_asked:  # learnt by a sibling branch's write: no new step starts
        raise Cancelled()
    if ctx.draining:
        raise DrainOrphan(run.fence.run_id, step_id)

    step = {"step_id": step_id, "name": name, "started_at": timezone.now()}
    step["args"] = serde.dumps(serde.to_json(list(args)))
    step["kwargs"] = serde.dumps(serde.to_json(kwargs))
    serde.check_size(f"the arguments of step {step_id}", step["args"], step["kwargs"])
    try:
        while True:
            if unsafe_to_repeat and row != Step.Status.STARTED:
                # Its effect is claimed before each call: a crash during the
                # call leaves it started, and the run blocked.
                record(run, step, Step.Status.STARTED, None, None, replacing=row, attempts=attempt)
                row = Step.Status.STARTED
            ctx.step_attempt = attempt
            outcome = _call(ctx, step, func, args, kwargs)
            error = outcome.error
            retrying = policy is not None and policy.retries_after(error, attempt)
            if runner.fault is not None:
                runner.fault(ctx, step_id, name)
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
                record(
                    run,
                    step,
                    Step.Status.RETRYING,
                    retry_at_text,
                    outcome.error_text,
                    replacing=row,
                    attempts=attempt,
                )
                row = Step.Status.RETRYING
                stop_if_cancel_asked(run)
            if durable:
                run.outcomes[step_id] = {
                    "name": name,
                    "status": Step.Status.RETRYING,
                    "result": retry_at,
                    "error": outcome.encoded_error,
                }
                run.attempts[step_id] = attempt
                raise Sleeping(run.fence.run_id, step_id, retry_at)
            time.sleep(wait)
            attempt += 1

        record(
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
        events.announce("step_unrecorded", run.fence, step_id=step_id, exception=exc)
        raise
    events.announce(
        "step_recorded",
        run.fence,
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
    stop_if_cancel_asked(run)
    if error is not None:
        raise error
    return outcome.result


def stop_if_cancel_asked(run):
    """After a write that landed despite a cancel asked of the run: stop."""
    if run.cancel_asked:
        raise Cancelled()


class _Outcome(typing.NamedTuple):
    """What one call of a step's function gave, decoded and as JSON text
    (a tuple: made once per step, cheaper than a frozen dataclass)."""

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
            run.fence,
            step_id=step_id,
            step=step["name"],
        )
    outcome = _called(ctx, func, args, kwargs)
    if records.end_open_transaction():
        raise EverystepError(
            f"step {step_id} ({step['name']}) left autocommit off "
            f"(transaction.set_autocommit(False)): its open transaction was rolled back and its "
            f"outcome is not recorded; call transaction.set_autocommit(True) before the step's "
            f"function returns"
        )
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
        run.fence,
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
    check_recorded_as(run, step_id, recorded, SLEEP)
    if recorded is None:
        step = engine_step(step_id, SLEEP, [seconds])
        wake_at = step["started_at"] + datetime.timedelta(seconds=seconds)
        record(run, step, Step.Status.DONE, serde.dumps(serde.to_json(wake_at)), None)
        recorded = {"name": SLEEP, "status": Step.Status.DONE, "result": wake_at, "error": None}
        run.outcomes[step_id] = recorded
        stop_if_cancel_asked(run)
    wake_at = recorded["result"]
    if clock.now() < wake_at:
        raise Sleeping(run.fence.run_id, step_id, wake_at)


def engine_step(step_id, name, args):
    """The fields of a step the engine records itself (a sleep, a patch's
    marker, a wait), started now with `args`, for `record`."""
    return {
        "step_id": step_id,
        "name": name,
        "started_at": clock.now(),
        "args": serde.dumps(serde.to_json(args)),
        "kwargs": serde.dumps({}),
    }


def check_recorded_as(run, step_id, recorded, name):
    """`WorkflowCodeError` when the record at `step_id` (if any) is not of a
    `name` step: the workflow's code changed under the run, and says where."""
    if recorded is not None and recorded["name"] != name:
        raise WorkflowCodeError(
            f"run {run.fence.run_id} recorded step {step_id} as {recorded['name']}, but the "
            f"workflow now calls {name} there: its code changed under a run in flight; put new "
            f'code behind `if everystep.patched("a-name"):` so that runs in flight replay the '
            f"old path"
        )


#: The name a patch's marker is recorded under (`patched`).
PATCHED = "everystep.patched"


def patched(ctx, name):
    """Whether this run takes the code behind ``everystep.patched(name)``
    at this point: True on a run that reaches it for the first time (a
    marker is recorded under the id ``patched:NAME`` of this scope, which
    moves no position), and on every replay of such a run; False on a run
    whose recorded steps already went past this point without it — its
    next step by position, or a fork there, is recorded — so that it
    replays the path it took."""
    run = ctx.run
    marker = f"{ctx.prefix}patched:{name}"
    recorded = run.outcomes.get(marker)
    check_recorded_as(run, marker, recorded, PATCHED)
    if recorded is not None:
        return True
    following = ctx.peek_step_id()
    if any(step_id == following or step_id.startswith(f"{following}.") for step_id in run.outcomes):
        return False
    stop_if_cancel_asked(run)
    refuse_inside_transaction("patched()")
    step = engine_step(marker, PATCHED, [name])
    record(run, step, Step.Status.DONE, serde.dumps(True), None)
    run.outcomes[marker] = {
        "name": PATCHED,
        "status": Step.Status.DONE,
        "result": True,
        "error": None,
    }
    stop_if_cancel_asked(run)
    return True


def refuse_inside_transaction(what):
    """Raise `EverystepError` when this thread is inside ``transaction.atomic()``
    on any database: a step's record (or its effect) would ride the body's
    transaction, and a rollback would lose one without the other."""
    if len(connections.settings) == 1:
        databases = (local.connection(),)
    else:
        databases = connections.all(initialized_only=True)
    host = context.host_transaction()
    for db in databases:
        if records.open_transaction(db):
            raise EverystepError(
                f"{what} was called with autocommit off (transaction.set_autocommit(False)) on "
                f"database {db.alias!r} in a workflow body: its record would ride a transaction "
                f"that a crash rolls back; call transaction.set_autocommit(True) first, or keep "
                f"the transaction inside the step's function"
            )
        hosted = host.depths.get(db.alias, 0) if host is not None else 0
        if db.in_atomic_block and len(db.atomic_blocks) > hosted:
            raise EverystepError(
                f"{what} was called inside transaction.atomic() (database {db.alias!r}) "
                f"in a workflow body: move the atomic block into the step's function, "
                f"so the step's effect and its record cannot be split by a rollback"
            )


def record(run, step, status, result, error, *, replacing=None, attempts=1, alongside=None):
    """Write a step's outcome (or its ``started``, ``retrying`` or
    ``waiting`` row): a new row, or in place of its row in status
    `replacing`; fenced and retried. A retry after a lost reply finds out
    whether the first write had landed. Returns True.

    With `alongside`, a write that belongs with the step's (a message
    consumed, an event published): called first, in the same transaction,
    it returns whether to go on. When it does not, nothing is written and
    `record` returns False.

    A write refused because a cancel was asked of the run: an outcome is
    written all the same (the step in flight is recorded) and the run is
    marked to stop (`RunState.cancel_asked`); a ``started`` row, which
    would begin a new step, is not, and `Cancelled` is raised. Any other
    refusal raises `ClaimLost`: the run is no longer this runner's."""
    step_id = step["step_id"]

    def write(attempt, despite_cancel=False):
        if alongside is None:
            landed = write_step(despite_cancel)
        else:
            with transaction.atomic():
                landed = write_step(despite_cancel) if alongside() else _SKIPPED
                if landed is not True:
                    transaction.set_rollback(True)
        if landed is not True and attempt > 1 and steps.step_recorded(run.fence, step_id, status):
            return True
        return landed

    def write_step(despite_cancel):
        if replacing is not None:
            landed = steps.update_step(
                run.fence, step_id, replacing, status, result, error, attempts, despite_cancel
            )
        else:
            landed = steps.record_step(
                run.fence,
                status=status,
                result=result,
                error=error,
                attempts=attempts,
                despite_cancel=despite_cancel,
                **step,
            )
        return landed

    what = f"recording step {step_id} of run {run.run_text}"
    landed = records.guarded(write, what)
    if landed is _SKIPPED:
        return False
    if landed:
        return True
    if not records.guarded(
        lambda attempt: runs.cancel_asked(run.fence), f"reading run {run.fence.run_id}"
    ):
        raise ClaimLost(run.fence.run_id, step_id)
    if status == Step.Status.STARTED:
        raise Cancelled()
    landed = records.guarded(lambda attempt: write(attempt, despite_cancel=True), what)
    if landed is _SKIPPED:
        return False
    if not landed:
        raise ClaimLost(run.fence.run_id, step_id)
    run.cancel_asked = True
    return True


#: `record`'s answer when its `alongside` write said not to go on.
_SKIPPED = "skipped"
