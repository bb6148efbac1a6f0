"""A running workflow's dealings with the world (§15 of the contract): the
messages it receives and sends, the events it publishes, the child runs it
starts and the results it waits for.

Each is a step, recorded once and served from its record on replay. A wait
that cannot be served at once records a ``waiting`` step whose result is
its deadline (so that a replay keeps the same one), and the run leaves its
worker with `Waiting`: the runner parks it ``scheduled`` until the deadline,
and a message on its topic, or the end of the run it waits for, makes it
due sooner (`everystep.db.runs.park`). When it runs again, the step looks
once more and either gets what it waited for or, past its deadline, records
that it timed out.

A message is consumed in the transaction that records the step receiving
it: a crash before that commit — the test hook `runner.fault` is called
between the two writes — leaves it in the mailbox, and after it the step's
record serves it on replay, so each message is received once.
"""

import datetime
import functools
import hashlib
import time

from everystep.core import clock, serde
from everystep.db import mailbox, runs
from everystep.engine import records, runner
from everystep.engine.steps import (
    check_recorded_as,
    engine_step,
    record,
    refuse_inside_transaction,
    run_step,
    stop_if_cancel_asked,
)
from everystep.errors import EverystepError, Waiting
from everystep.models import Step, Workflow

RECEIVE = "everystep.receive"
SEND = "everystep.send"
SET_EVENT = "everystep.set_event"
GET_EVENT = "everystep.get_event"
START = "everystep.start"
RESULT = "everystep.result"

#: How often a wait outside a workflow body reads again (`get_event`).
POLL_SECONDS = 0.5


def receive(ctx, step_id, topic, timeout):
    """The oldest message on `topic` in the run's mailbox, consumed by the
    step `step_id`; else the run waits for one until `timeout` seconds
    from the step's first call (None: for ever), then returns None."""
    run = ctx.run
    recorded = _recorded(run, step_id, RECEIVE)
    if recorded is not None and recorded["status"] == Step.Status.DONE:
        return recorded["result"]
    _new_step(run, "receive()")
    deadline = _deadline(recorded, timeout)
    step = engine_step(step_id, RECEIVE, [topic, timeout])
    replacing = None if recorded is None else Step.Status.WAITING
    while True:
        found = records.guarded(
            lambda attempt: mailbox.oldest(run.fence.run_id, topic), "reading the mailbox"
        )
        if found is None:
            break
        message_id, payload = found

        def take(message_id=message_id):
            if not mailbox.consume(message_id, step_id):
                return False
            if runner.fault is not None:  # taken, in the transaction, not yet recorded
                runner.fault(ctx, step_id, RECEIVE)
            return True

        consumed = record(
            run,
            step,
            Step.Status.DONE,
            serde.dumps(serde.to_json(payload)),
            None,
            replacing=replacing,
            alongside=take,
        )
        if consumed:
            return _done(run, step_id, RECEIVE, payload)
        # Consumed meanwhile by a parallel branch receiving on the same
        # topic: the next one, if there is one.
    return _wait(run, step, recorded, deadline, None, topic=topic)


def send(ctx, step_id, run_id, topic, payload, idempotency_key):
    """Send a message from a workflow body: a step, keyed so that a replay
    after a crash does not send it twice."""
    key = idempotency_key or _key(ctx, step_id)
    return run_step(
        ctx, step_id, SEND, _send, [run_id, topic, payload], {"idempotency_key": key}, False
    )


def _send(run_id, topic, payload, idempotency_key):
    mailbox.send(run_id, topic, payload, idempotency_key)


def set_event(ctx, step_id, key, value):
    """Publish `value` as the run's latest for `key`, recorded as the step
    `step_id` in the same transaction as the event's row."""
    run = ctx.run
    recorded = _recorded(run, step_id, SET_EVENT)
    if recorded is not None:
        return
    _new_step(run, "set_event()")
    step = engine_step(step_id, SET_EVENT, [key, value])
    record(
        run,
        step,
        Step.Status.DONE,
        None,
        None,
        alongside=lambda: mailbox.publish(run.fence.run_id, key, value, step_id) or True,
    )
    _done(run, step_id, SET_EVENT, None)


def get_event(ctx, step_id, run_id, key, timeout):
    """`get_event` in a workflow body: a step, so a replay reads what the
    first call read."""
    return run_step(ctx, step_id, GET_EVENT, read_event, [run_id, key, timeout], {}, False)


def read_event(run_id, key, timeout):
    """The latest value the run `run_id` set for `key`, waiting up to
    `timeout` seconds for a first one; None if there is none."""
    give_up = time.monotonic() + timeout
    while True:
        found, value = mailbox.latest(run_id, key)
        if found:
            return value
        left = give_up - time.monotonic()
        if left <= 0:
            if not runs.run_exists(run_id):
                raise EverystepError(f"no run {run_id}")
            return None
        time.sleep(min(POLL_SECONDS, left))


def start(ctx, step_id, name, args, placement, idempotency_key, trace_context):
    """Schedule a child run of the workflow `name` as the step `step_id`,
    placed as `placement` says (queue, priority, concurrency key); returns
    its id. The child's idempotency key is the parent's run and step (unless
    one is given): a replay after a crash between the insert and the step's
    record gets the same child back."""
    key = idempotency_key or _key(ctx, step_id)
    insert = functools.partial(
        _start, name=name, parent=ctx.workflow_id, trace_context=trace_context
    )
    return run_step(ctx, step_id, START, insert, args, {**placement, "idempotency_key": key}, False)


def _start(*args, name, parent, trace_context, idempotency_key, **placement):
    child = runs.insert_run(
        name, list(args), idempotency_key, trace_context, parent_id=parent, **placement
    )
    return child.id


def await_run(ctx, step_id, run_id, timeout):
    """The result of the run `run_id` once it has ended, recorded as the
    step `step_id`: its result, or what it ended with raised (its
    exception; `Terminal` if stopped; `Cancelled`). `TimeoutError` after
    `timeout` seconds from the step's first call (None: no limit)."""
    run = ctx.run
    recorded = _recorded(run, step_id, RESULT)
    if recorded is not None and recorded["status"] == Step.Status.DONE:
        return recorded["result"]
    if recorded is not None and recorded["status"] == Step.Status.FAILED:
        raise serde.decode_exception(recorded["error"])
    if run_id == ctx.workflow_id:
        raise EverystepError(f"run {run_id} cannot wait for its own result")
    _new_step(run, "result()")
    deadline = _deadline(recorded, timeout)
    step = engine_step(step_id, RESULT, [str(run_id), timeout])
    replacing = None if recorded is None else Step.Status.WAITING
    found = records.guarded(lambda attempt: runs.outcome(run_id), f"reading run {run_id}")
    if found is None:
        raise EverystepError(f"no run {run_id}")
    ended = found if found[0] in Workflow.ENDED else None
    if ended is None and clock.now() >= deadline:
        ended = (
            Workflow.Status.FAILED,
            None,
            serde.encode_exception(TimeoutError(f"run {run_id} had not ended in {timeout} s")),
        )
    if ended is not None:
        status, result, error = ended
        if status == Workflow.Status.COMPLETED:
            record(run, step, Step.Status.DONE, serde.encode(result), None, replacing=replacing)
            return _done(run, step_id, RESULT, result)
        record(run, step, Step.Status.FAILED, None, serde.dumps(error), replacing=replacing)
        run.outcomes[step_id] = {
            "name": RESULT,
            "status": Step.Status.FAILED,
            "result": None,
            "error": error,
        }
        raise serde.decode_exception(error)
    return _wait(run, step, recorded, deadline, None, awaited=run_id)


def _wait(run, step, recorded, deadline, result, *, topic=None, awaited=None):
    """Nothing yet: past the deadline the step records `result` (a
    receive's None); else its ``waiting`` row is recorded (once) and the
    run leaves to wait."""
    step_id = step["step_id"]
    replacing = None if recorded is None else Step.Status.WAITING
    if clock.now() >= deadline:
        record(run, step, Step.Status.DONE, serde.encode(result), None, replacing=replacing)
        return _done(run, step_id, step["name"], result)
    if recorded is None:
        record(run, step, Step.Status.WAITING, serde.encode(deadline), None)
        run.outcomes[step_id] = {
            "name": step["name"],
            "status": Step.Status.WAITING,
            "result": deadline,
            "error": None,
        }
    raise Waiting(run.fence.run_id, step_id, deadline, topic=topic, awaited=awaited)


def _new_step(run, what):
    """Before a wait writes anything: as before any new step, none starts
    in a run asked to cancel, nor inside the body's transaction."""
    stop_if_cancel_asked(run)
    refuse_inside_transaction(what)


def _recorded(run, step_id, name):
    """The record at `step_id`, if any, checked to be a `name` step."""
    recorded = run.outcomes.get(step_id)
    check_recorded_as(run, step_id, recorded, name)
    return recorded


def _deadline(recorded, timeout):
    """A wait's deadline: as recorded by its first call, else from now."""
    if recorded is not None:
        return recorded["result"]
    if timeout is None:
        return clock.FOREVER
    return clock.now() + datetime.timedelta(seconds=timeout)


def _done(run, step_id, name, result):
    """Note the step's record in the run's outcomes and return `result`,
    unless a cancel asked of the run was learnt as it was written."""
    done = {"name": name, "status": Step.Status.DONE, "result": result, "error": None}
    run.outcomes[step_id] = done
    stop_if_cancel_asked(run)
    return result


def _key(ctx, step_id):
    """The idempotency key of what the step `step_id` of this run does
    (a message it sends, a child it starts): at most 255 characters."""
    key = f"{ctx.workflow_id}/{step_id}"
    if len(key) > 255:
        key = f"{ctx.workflow_id}/{hashlib.sha256(step_id.encode()).hexdigest()}"
    return key
