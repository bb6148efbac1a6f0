"""The public surface: `workflow`, `step`, `parallel`, `schedule`, `sleep`,
`patched`, and the waits of §15: `send` and `receive`, `set_event` and `get_event`,
`start` and `RunHandle`, `result` and `aresult`.

Outside a running workflow every decorated function is a plain function;
inside one, step calls are recorded and replayed by `everystep.engine.runner`.
This module imports no Django, so ``import everystep`` stays cheap.
"""

import contextvars
import dataclasses
import functools
import sys
import threading
import time
import uuid

from everystep.core import clock, events, ids, queues, registry, retry_policy
from everystep.engine import context
from everystep.errors import (
    Cancelled,
    ClaimLost,
    EngineSignal,
    EverystepError,
    Sleeping,
    Terminal,
)


def workflow(func=None, *, cron=None, timezone="UTC", queue=queues.DEFAULT, priority=0, **options):
    """Mark `func` as a workflow, registered as ``module.qualname``: bare
    ``@workflow`` or ``@workflow(cron="*/5 * * * *", queue="reports", priority=10)``.

    Called directly, it runs as a plain function. `schedule()` it to run it
    durably on a worker. With `cron`, the workers also run it, with no
    arguments, once per tick of the expression read in `timezone`
    (`everystep.core.cron`). Its runs wait in `queue` (an `everystep.Queue`
    limits them) at `priority` (-100 to 100, higher first) unless
    `schedule()` says otherwise. A bad expression, zone, queue name or
    priority raises `EverystepError` naming the workflow, when the module
    is imported.
    """
    if options:
        given = ", ".join(f"{option}=" for option in options)
        raise EverystepError(
            f"@workflow takes cron=, timezone=, queue= and priority=, not {given}"
            + (": retries are a step's option, @step(retries=...)" if "retries" in options else "")
        )
    if func is None:
        return functools.partial(
            workflow, cron=cron, timezone=timezone, queue=queue, priority=priority
        )
    name = registry.qualified_name(func)
    try:
        queues.check_name(queue)
        queues.check_priority(priority)
    except EverystepError as exc:
        raise EverystepError(f"workflow {name}: {exc}") from None
    schedule = None
    if cron is not None:
        from everystep.core import cron as cron_schedules

        schedule = cron_schedules.schedule_for(func, name, cron, timezone)
    func.__everystep_workflow__ = registry.register(func, schedule, queue, priority, name=name)
    return func


def step(
    func=None,
    *,
    unsafe_to_repeat=False,
    retries=0,
    backoff=1.0,
    max_backoff=300.0,
    retry_on=(Exception,),
):
    """Mark a function as a step: bare ``@step`` or ``@step(...)``.

    Inside a running workflow each call is recorded once and served from the
    record on replay; a call may pass ``everystep_id="name"`` to take a stable
    name instead of the next position. An unsafe-to-repeat step is never run
    twice: if its outcome was lost, the run ends ``blocked``. Outside a
    workflow, and inside another step's function, the function runs as a
    plain call and ``everystep_id`` is dropped.

    With `retries`, a call that raises one of `retry_on` is called again, up
    to `retries` more times, `backoff` × 2^k seconds apart (capped at
    `max_backoff`, jittered): in place for a wait up to a second, else
    durably, the run leaving its worker until then. `Terminal` is never
    retried, nor an unsafe step whose outcome is unknown. The step's record
    keeps the number of attempts and, while it waits, the last error. Bad
    options raise `EverystepError` when the function is decorated.

    A step called while the workflow body is inside ``transaction.atomic()``
    raises `EverystepError` before anything runs: its record would ride the
    body's transaction and vanish with it.
    """
    policy = retry_policy.policy(retries, backoff, max_backoff, retry_on)
    if func is None:
        return functools.partial(
            step,
            unsafe_to_repeat=unsafe_to_repeat,
            retries=retries,
            backoff=backoff,
            max_backoff=max_backoff,
            retry_on=retry_on,
        )

    name = registry.qualified_name(func)

    @functools.wraps(func)
    def recorded(*args, everystep_id=None, **kwargs):
        ctx = context.current()
        if ctx is None or not ctx.recording:
            return func(*args, **kwargs)
        from everystep.engine import steps

        steps.refuse_inside_transaction("a step")

        step_id = ctx.next_step_id(everystep_id)
        return steps.run_step(ctx, step_id, name, func, args, kwargs, unsafe_to_repeat, policy)

    recorded.__everystep_step__ = name
    return recorded


def parallel(*branches, everystep_id=None):
    """Run `branches` concurrently, one thread each, and return their results
    as a tuple in branch order.

    A branch is a zero-argument callable, or a non-empty list of them run in
    order (its result is a tuple). Every branch runs to completion even when
    a sibling fails; then one failure is raised as is and several as an
    `ExceptionGroup`, except that a `Terminal` or an engine signal (drain,
    uncertain effect) from any branch is raised first. Inside a workflow the
    fork takes a step id (`everystep_id` names it) and branch ``i`` records its
    steps under ``<fork>.<i>.``.
    """
    for branch in branches:
        _check_branch(branch)
    parent = context.current()
    recording = parent is not None and parent.recording
    fork_id = None
    if recording:
        from everystep.engine import steps

        steps.refuse_inside_transaction("parallel()")
        fork_id = parent.next_step_id(everystep_id)

    results = [None] * len(branches)
    errors = [None] * len(branches)

    def run_branch(index, branch, inline=False):
        # Inside a step's function the branches share its (non-recording)
        # context, so they still see the run through `context.current()`.
        scope = parent.child(fork_id, index) if recording else parent
        try:
            with context.activated(scope):
                if isinstance(branch, list):
                    results[index] = tuple(call() for call in branch)
                else:
                    results[index] = branch()
        except BaseException as exc:  # noqa: B036 - re-raised on the parent thread
            errors[index] = exc
        finally:
            if not inline:
                _close_thread_connections()

    if recording:
        events.announce("fork_started", parent.run.fence, fork_id=fork_id, count=len(branches))
    try:
        if context.host_transaction() is not None:
            # Inside a test's transaction, which only this thread's
            # connection sees: the branches run here, one after the other.
            for i, branch in enumerate(branches):
                contextvars.copy_context().run(run_branch, i, branch, inline=True)
        else:
            # Each branch starts from a copy of this thread's context
            # variables: a trace's current span (the fork's), for one,
            # carries across.
            threads = [
                threading.Thread(
                    target=contextvars.copy_context().run,
                    args=(run_branch, i, b),
                    name=f"everystep-branch-{i}",
                )
                for i, b in enumerate(branches)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    finally:
        if recording:
            events.announce("fork_ended", parent.run.fence, fork_id=fork_id)
    _raise_branch_errors([error for error in errors if error is not None])
    return tuple(results)


def schedule(
    workflow_func,
    *args,
    idempotency_key=None,
    run_at=None,
    delay=None,
    queue=None,
    priority=None,
    concurrency_key=None,
):
    """Insert a ``scheduled`` run of `workflow_func` in the caller's current
    transaction and return its `everystep.models.Workflow` row.

    The run is claimable once that transaction commits and gone if it rolls
    back; with `run_at` (an aware datetime) or `delay` (a `timedelta` or
    seconds), not before that time. With `idempotency_key`, scheduling the
    same workflow with the same key again, concurrently or later, returns
    the existing run. `queue` and `priority` override the workflow's;
    `concurrency_key` is what a queue's ``key_concurrency`` counts by, and
    a queue declared with one needs it.

    The row's ``get_result(timeout=None)`` waits for the run's end and
    returns its result (`result`); its ``result`` is the stored column.
    """
    name = _workflow_name(workflow_func)
    ids.check_idempotency_key(idempotency_key)
    placement = _placement(name, queue, priority, concurrency_key)
    due = clock.due_time(run_at, delay)
    from everystep.core import serde
    from everystep.db import runs
    from everystep.observe import tracing

    serde.to_json(list(args))  # refuse bad arguments before touching the database
    run = runs.insert_run(
        name, list(args), idempotency_key, tracing.current_context(), due, **placement
    )
    run.get_result = functools.partial(result, run.id)
    return run


def _workflow_name(workflow_func):
    name = getattr(workflow_func, "__everystep_workflow__", None)
    if name is None:
        raise TypeError(f"{workflow_func!r} is not an @everystep.workflow function")
    return name


def _placement(name, queue, priority, concurrency_key):
    """Where a run of the workflow `name` waits: its queue and priority
    (the workflow's unless given) and concurrency key, checked."""
    default_queue, default_priority = registry.placement(name)
    queue = queues.check_name(default_queue if queue is None else queue)
    priority = queues.check_priority(default_priority if priority is None else priority)
    queues.check_key(concurrency_key)
    declared = queues.declared_queue(queue)
    if declared is not None and declared.key_concurrency is not None and concurrency_key is None:
        raise EverystepError(
            f"queue {queue!r} limits runs per concurrency_key: schedule its runs with one"
        )
    return {"queue": queue, "priority": priority, "concurrency_key": concurrency_key}


async def aschedule(workflow_func, *args, **options):
    """`schedule`, for async code (an async view, a consumer), with the same
    options: the insert runs on Django's thread for synchronous database
    work, in the transaction open there, if any."""
    from asgiref.sync import sync_to_async

    return await sync_to_async(schedule, thread_sensitive=True)(workflow_func, *args, **options)


def sleep(duration, everystep_id=None):
    """Pause the running workflow for `duration` (a `timedelta` or seconds),
    durably: the run records its wake time as a step, leaves its worker —
    freeing the pool slot — and resumes on any worker once that time has
    passed. On replay, a sleep whose wake time has passed returns at once.
    It takes a step id like a step (`everystep_id` names it).

    Outside a workflow, and inside a step's function, it is `time.sleep`.
    """
    seconds = clock.seconds(duration, "the sleep's duration")
    ctx = context.current()
    if ctx is None or not ctx.recording:
        time.sleep(seconds)
        return
    from everystep.engine import steps

    steps.refuse_inside_transaction("sleep()")
    steps.sleep(ctx, ctx.next_step_id(everystep_id), seconds)


def patched(name):
    """Whether the running workflow takes the code behind this patch: True
    on a run that reaches this point for the first time (a marker is
    recorded, so its replays agree), False on a run whose recorded steps
    already went past this point without it, so that it replays the path it
    took::

        if everystep.patched("fee"):
            charge_fee(order)     # runs started before the deploy skip it
        ship(order)

    The marker moves no step position: once no run in flight predates the
    patch, the call can go and its branch stay. Outside a workflow body, and
    inside a step's function, it is True (the code as it is). `EverystepError`
    for a name that is not a step's name (letters, digits, ``_``, ``-``).
    """
    ids.check_name(name, "a patch name", max_length=200)
    ctx = _recording_context()
    if ctx is None:
        return True
    from everystep.engine import steps

    return steps.patched(ctx, name)


def send(run_id, topic, payload=None, idempotency_key=None, *, everystep_id=None):
    """Send `payload` to the run `run_id` on `topic`: it waits in the run's
    mailbox until a `receive()` of that topic consumes it, and a run parked
    in such a receive is woken. Stored in the caller's transaction (gone if
    it rolls back); with `idempotency_key`, sending again with the same key
    stores nothing more. In a workflow body it is a step (`everystep_id`
    names it), sent once however often the body replays.

    `EverystepError` for a run that does not exist or has ended, a topic
    that is not a name (as a step's ``everystep_id``), or a payload that
    cannot be stored (the rules of a step's result).
    """
    from everystep.db import mailbox

    run_id = mailbox.check(run_id, topic, payload, idempotency_key)
    ctx = _recording_context()
    if ctx is not None:
        from everystep.engine import steps, waits

        steps.refuse_inside_transaction("send()")
        step_id = ctx.next_step_id(everystep_id)
        return waits.send(ctx, step_id, run_id, topic, payload, idempotency_key)
    mailbox.send(run_id, topic, payload, idempotency_key)


def receive(topic, timeout=None, everystep_id=None):
    """In a workflow body, the payload of the oldest message on `topic` sent
    to this run, consumed: a step (`everystep_id` names it), each message
    received once across replays and crashes. With none there the run
    waits for one — parked ``scheduled``, holding no worker — until
    `timeout` (a `timedelta` or seconds; None: for ever) from the first
    call, and then returns None.

    `EverystepError` outside a workflow body, or for a topic that is not a
    name.
    """
    ids.check_name(topic, "a message's topic")
    seconds = None if timeout is None else clock.seconds(timeout, "receive()'s timeout")
    ctx = _body_context("receive()")
    from everystep.engine import waits

    return waits.receive(ctx, ctx.next_step_id(everystep_id), topic, seconds)


def set_event(key, value, everystep_id=None):
    """In a workflow body, publish `value` as this run's latest for `key`,
    for `get_event()` to read from anywhere (progress, a status a web page
    shows): a step (`everystep_id` names it).

    `EverystepError` outside a workflow body, for a key that is not a name,
    or a value that cannot be stored.
    """
    ids.check_name(key, "an event's key")
    from everystep.core import serde

    serde.check_size(f"the value of event {key!r}", serde.encode(value))
    ctx = _body_context("set_event()")
    from everystep.engine import waits

    waits.set_event(ctx, ctx.next_step_id(everystep_id), key, value)


def get_event(run_id, key, timeout=0, *, everystep_id=None):
    """The latest value the run `run_id` published for `key`, waiting up to
    `timeout` (a `timedelta` or seconds) for a first one; None if none came.
    In a workflow body it is a step, so a replay reads the same.
    `EverystepError` for no such run."""
    run_id = ids.parse_run_id(run_id)
    ids.check_name(key, "an event's key")
    seconds = clock.seconds(timeout, "get_event()'s timeout")
    from everystep.engine import waits

    ctx = _recording_context()
    if ctx is not None:
        return waits.get_event(ctx, ctx.next_step_id(everystep_id), run_id, key, seconds)
    return waits.read_event(run_id, key, seconds)


@dataclasses.dataclass(frozen=True)
class RunHandle:
    """A run started by `start()` (or any run, by its id)."""

    run_id: uuid.UUID

    def result(self, timeout=None, everystep_id=None):
        """The run's result once it has ended: see `everystep.result`."""
        return result(self.run_id, timeout, everystep_id=everystep_id)

    def __str__(self):
        return str(self.run_id)


def start(
    workflow_func,
    *args,
    everystep_id=None,
    queue=None,
    priority=None,
    idempotency_key=None,
    concurrency_key=None,
):
    """In a workflow body, schedule a child run of `workflow_func` with
    `args` and return its `RunHandle`: a step (`everystep_id` names it), so
    however often the body replays there is one child. The child records
    this run as its parent, and is cancelled with it. `queue`, `priority`,
    `idempotency_key` and `concurrency_key` are `schedule()`'s.

    `EverystepError` outside a workflow body, and for what `schedule()`
    refuses.
    """
    name = _workflow_name(workflow_func)
    ids.check_idempotency_key(idempotency_key)
    placement = _placement(name, queue, priority, concurrency_key)
    from everystep.core import serde

    serde.to_json(list(args))
    ctx = _body_context("start()")
    from everystep.engine import steps, waits
    from everystep.observe import tracing

    steps.refuse_inside_transaction("start()")
    step_id = ctx.next_step_id(everystep_id)
    trace_context = tracing.current_context()
    child = waits.start(ctx, step_id, name, list(args), placement, idempotency_key, trace_context)
    return RunHandle(child)


def result(run_id, timeout=None, *, everystep_id=None):
    """Wait until the run `run_id` has ended, and return its result or raise
    what it ended with: its exception (decoded), `Terminal` if it was
    stopped, `Cancelled` if cancelled. A ``blocked`` run has not ended: an
    operator resolves it and it goes on. `TimeoutError` after `timeout` (a
    `timedelta` or seconds; None: no limit).

    In a workflow body this is a step (`everystep_id` names it) and a
    durable wait: the run is parked, holding no worker, until that run ends,
    and the outcome is recorded, so a replay returns or raises the same.
    Elsewhere it blocks the calling thread, reading the run at most once a
    second (on PostgreSQL, woken by the run's end at once). `EverystepError`
    for no such run.
    """
    run_id = ids.parse_run_id(run_id)
    seconds = None if timeout is None else clock.seconds(timeout, "result()'s timeout")
    ctx = _recording_context()
    if ctx is not None:
        from everystep.engine import waits

        return waits.await_run(ctx, ctx.next_step_id(everystep_id), run_id, seconds)
    from everystep.db import ends

    return ends.result(run_id, seconds)


async def aresult(run_id, timeout=None):
    """`result`, for async code: the wait runs on a thread of its own, not
    on Django's thread for synchronous database work."""
    from asgiref.sync import sync_to_async

    def wait():
        try:
            return result(run_id, timeout)
        finally:
            _close_thread_connections()

    return await sync_to_async(wait, thread_sensitive=False)()


def _recording_context():
    """The running workflow's context, if this is its body (not a step's
    function), else None."""
    ctx = context.current()
    return ctx if ctx is not None and ctx.recording else None


def _body_context(what):
    """The running workflow body's context; `EverystepError` elsewhere."""
    ctx = _recording_context()
    if ctx is None:
        where = "inside a step's function" if context.current() is not None else "outside one"
        raise EverystepError(f"{what} is a step of a workflow body: it cannot be called {where}")
    return ctx


# The waits are steps of a body, recorded under these names: the step graph
# (`everystep.ui.graph`) draws them, and `testing.crash_after` takes them.
for _function, _recorded_as in (
    (sleep, "everystep.sleep"),
    (send, "everystep.send"),
    (receive, "everystep.receive"),
    (set_event, "everystep.set_event"),
    (get_event, "everystep.get_event"),
    (start, "everystep.start"),
    (result, "everystep.result"),
):
    _function.__everystep_step__ = _recorded_as


def _check_branch(branch):
    calls = branch if isinstance(branch, list) else [branch]
    if not calls or not all(callable(call) for call in calls):
        raise TypeError(
            f"parallel() takes zero-argument callables or non-empty lists of them, not {branch!r}"
        )


def _raise_branch_errors(errors):
    """Raise what a fork's failed branches amount to (see `parallel`)."""
    if not errors:
        return
    # A cancel or a lost claim outranks a sleep or a drain in a sibling.
    for error in errors:
        if isinstance(error, Cancelled | ClaimLost):
            raise error
    # Branches that wait all leave with the run: it is due again when the
    # first of them is (their records keep the others' waits).
    waits = [error for error in errors if isinstance(error, Sleeping)]
    if waits and len(waits) == sum(isinstance(error, EngineSignal) for error in errors):
        raise min(waits, key=lambda wait: wait.wake_at)
    for urgent in (EngineSignal, Terminal):
        for error in errors:
            if isinstance(error, urgent):
                raise error
    if len(errors) == 1:
        raise errors[0]
    if all(isinstance(error, Exception) for error in errors):
        raise ExceptionGroup("several parallel branches failed", errors)
    raise BaseExceptionGroup("several parallel branches failed", errors)


def _close_thread_connections():
    """Close this thread's Django connections, if Django is in use at all."""
    if "django.db" in sys.modules:
        from django.db import connections

        connections.close_all()
