"""Django's Tasks framework on everystep: durable, recorded ``@task`` functions.

::

    TASKS = {
        "default": {
            "BACKEND": "everystep.tasks.EverystepBackend",
            "QUEUES": ["default", "emails"],          # [] or absent: any queue
            "OPTIONS": {"retries": 0, "backoff": 1.0},
        }
    }

Each ``@task`` function becomes a workflow named after the task's dotted
path, whose body is one recorded step that calls the function (an async
one on an event loop of the worker's) under the OPTIONS retry policy.
``task.enqueue()`` schedules a run of it in the caller's transaction, on the
task's queue and priority, due at its ``run_after``; the result's id is the
run's id, and ``get_result`` reads the run back as a `TaskResult`:

- ``READY``: scheduled (due or not);
- ``RUNNING``: running, or blocked on an uncertain step;
- ``SUCCESSFUL``: completed, with its return value;
- ``FAILED``: failed, stopped or cancelled, with its error.

Workers run the tasks of every installed app's ``tasks`` module (the app
imports them as it imports ``workflows``), and of the modules named in
``EVERYSTEP_WORKFLOWS``. Django ≥ 6.0 has ``django.tasks``; on 5.2 the
``django-tasks`` backport provides the same API, and is used when present.
"""

import contextvars
import dataclasses
import functools
import inspect

from asgiref.sync import async_to_sync
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

try:
    from django.tasks import TaskContext, TaskResult, TaskResultStatus, signals
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskError
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.utils.json import normalize_json
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import TaskContext, TaskResult, TaskResultStatus, signals
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import Task, TaskError
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.utils import normalize_json

from everystep import api
from everystep.core import ids, queues, registry, retry_policy, serde
from everystep.engine import context
from everystep.errors import EverystepError

#: The run's status → the task result's.
STATUSES = {
    "scheduled": TaskResultStatus.READY,
    "running": TaskResultStatus.RUNNING,
    "blocked": TaskResultStatus.RUNNING,
    "completed": TaskResultStatus.SUCCESSFUL,
    "failed": TaskResultStatus.FAILED,
    "stopped": TaskResultStatus.FAILED,
    "cancelled": TaskResultStatus.FAILED,
}
OPTIONS = {"retries": 0, "backoff": 1.0}
#: The step that calls a task's function: the first of its run.
STEP_ID = "1"


class EverystepBackend(BaseTaskBackend):
    """A Tasks backend whose tasks are everystep runs (see the module)."""

    supports_defer = True
    supports_get_result = True
    supports_priority = True
    supports_async_task = True

    def __init__(self, alias, params):
        super().__init__(alias, params)
        # No QUEUES, or an empty list: tasks may name any queue.
        self.queues = set(params.get("QUEUES") or ())
        unknown = set(self.options) - set(OPTIONS)
        if unknown:
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['OPTIONS'] takes {', '.join(OPTIONS)}, "
                f"not {', '.join(sorted(unknown))}"
            )
        settings = {**OPTIONS, **self.options}
        try:
            retry_policy.policy(settings["retries"], settings["backoff"])
            queues.accept(self.queues)
        except EverystepError as exc:
            raise ImproperlyConfigured(f"TASKS[{alias!r}]: {exc}") from None
        self.retries, self.backoff = settings["retries"], settings["backoff"]

    def validate_task(self, task):
        """Django's rules, an everystep queue name, and the task registered
        as the workflow that runs it."""
        super().validate_task(task)
        try:
            queues.check_name(task.queue_name, "a task's queue_name")
        except EverystepError as exc:
            raise InvalidTask(str(exc)) from None
        _register(task, self)

    def enqueue(self, task, args, kwargs):
        """Schedule a run of `task` in the caller's transaction."""
        self.validate_task(task)
        result = TaskResult(
            task=task,
            id="",
            status=TaskResultStatus.READY,
            enqueued_at=None,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=list(args),
            kwargs=dict(kwargs),
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        run = api.schedule(
            _workflow_of(task),
            result.args,
            result.kwargs,
            queue=task.queue_name,
            priority=task.priority,
            run_at=task.run_after,
        )
        object.__setattr__(result, "id", str(run.id))
        object.__setattr__(result, "enqueued_at", run.created_at)
        signals.task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id):
        """The task result of the run `result_id`, read from the run and its
        step; `TaskResultDoesNotExist` for an id of no task run."""
        from everystep.models import Step, Workflow

        try:
            run = Workflow.objects.get(id=ids.parse_run_id(str(result_id)))
        except (EverystepError, Workflow.DoesNotExist):
            raise TaskResultDoesNotExist(result_id) from None
        task = _task_named(run.name)
        if task is None or len(run.args) != 2:
            raise TaskResultDoesNotExist(result_id)
        step = Step.objects.filter(workflow=run, step_id=STEP_ID).first()
        return _result(task.using(queue_name=run.queue, priority=run.priority), run, step, self)


def _result(task, run, step, backend):
    """The `TaskResult` of the run `run` of `task`, with `step` its call's record."""
    args, kwargs = run.args
    status = STATUSES[run.status]
    attempts = step.attempts if step is not None else (1 if run.claimed_by else 0)
    error = run.error or (step.error if step is not None else None)
    errors = [] if status != TaskResultStatus.FAILED or not error else [_task_error(error)]
    result = TaskResult(
        task=task,
        id=str(run.id),
        status=status,
        enqueued_at=run.created_at,
        started_at=run.started_at,
        finished_at=run.completed_at,
        last_attempted_at=step.started_at if step is not None else run.claimed_at,
        args=args,
        kwargs=kwargs,
        backend=backend.alias,
        errors=errors,
        # One per attempt; a run keeps only the worker that last held it.
        worker_ids=[run.claimed_by or ""] * attempts,
    )
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", run.result)
    return result


def _task_error(error):
    """A recorded error (`everystep.core.serde.encode_exception`) as Django's `TaskError`."""
    return TaskError(
        exception_class_path=error.get("type", "Exception"),
        traceback=error.get("traceback") or f"{error.get('type')}: {error.get('message')}",
    )


def _task_named(name):
    """The `Task` whose function is registered under `name`, or None."""
    workflow = registry.get(name)
    task = getattr(workflow, "__everystep_task__", None)
    if task is not None:
        return task
    try:
        found = import_string(name)
    except ImportError:
        return None
    return found if isinstance(found, Task) else None


def _workflow_of(task):
    return registry.get(task.module_path)


def _register(task, backend):
    """Register the workflow that runs `task`: under the task's dotted path,
    one step calling its function with the backend's retry policy."""
    name = task.module_path
    known = getattr(registry.get(name), "__everystep_task__", None)
    # The same task with other options (`using()`, and each result read)
    # runs as the same workflow, registered once with the task's own.
    if known is not None and known.func is task.func and known.backend == task.backend:
        return
    call = functools.partial(_call, task, backend)
    call.__module__, call.__qualname__ = task.func.__module__, task.func.__qualname__
    step = api.step(call, retries=backend.retries, backoff=backend.backoff)

    def run_task(args, kwargs):
        try:
            value = step(args, kwargs)
        except Exception as exc:
            _finished(backend, TaskResultStatus.FAILED, exc)
            raise
        _finished(backend, TaskResultStatus.SUCCESSFUL, value=value)
        return value

    run_task.__module__, run_task.__qualname__ = task.func.__module__, task.func.__qualname__
    run_task.__everystep_task__ = task
    run_task.__everystep_workflow__ = registry.register(
        run_task, queue=task.queue_name, priority=task.priority, name=name
    )


def _call(task, backend, args, kwargs):
    """The step: the task's function called once, with its context if it
    takes one, and its return value normalized as Django's backends do."""
    result = _running(backend)
    signals.task_started.send(type(backend), task_result=result)
    if task.takes_context:
        args = [TaskContext(task_result=result), *args]
    if inspect.iscoroutinefunction(task.func):
        value = async_to_sync(task.func)(*args, **kwargs)
    else:
        value = task.func(*args, **kwargs)
    return normalize_json(value)


#: The task result read for the attempt running now, which its end reuses.
_attempt_result = contextvars.ContextVar("everystep_task_result", default=None)


def _running(backend):
    """The task result of the run executing now, ``RUNNING`` in its current attempt."""
    ctx = context.current()
    result = backend.get_result(ctx.workflow_id)
    object.__setattr__(result, "status", TaskResultStatus.RUNNING)
    object.__setattr__(result, "worker_ids", [ctx.run.fence.worker] * ctx.step_attempt)
    _attempt_result.set(result)
    return result


def _finished(backend, status, exc=None, value=None):
    """Send ``task_finished`` for the run executing now, ending `status`:
    the result its attempt read, or read now (a step replayed, not run)."""
    ctx = context.current()
    result = _attempt_result.get()
    if result is None or result.id != str(ctx.workflow_id):
        result = backend.get_result(ctx.workflow_id)
    result = dataclasses.replace(result, status=status)
    if exc is not None:
        object.__setattr__(result, "errors", [_task_error(serde.encode_exception(exc))])
    else:
        object.__setattr__(result, "_return_value", value)
    signals.task_finished.send(type(backend), task_result=result)
