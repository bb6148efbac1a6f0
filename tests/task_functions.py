"""Django ``@task`` functions on the everystep backend, for tests/test_tasks.py
(``EVERYSTEP_TEST_WORKFLOWS=tests.workflows,tests.task_functions``).

The signal receivers append what they saw, one JSON line each, to the file
``EVERYSTEP_TEST_SIGNALS`` names: a worker subprocess's signals are read
back by the test."""

import json
import os

try:
    from django.tasks import signals, task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import signals, task


@task
def add(a, b):
    return a + b


@task(queue_name="emails", priority=10)
def send_email(to, subject="hello"):
    return {"to": to, "subject": subject}


@task
async def count_runs():
    from everystep.models import Workflow

    return await Workflow.objects.acount()


@task(takes_context=True)
def introduce(context, name):
    return {"name": name, "attempt": context.attempt, "id": context.task_result.id}


@task(backend="retrying", takes_context=True)
def flaky(context):
    if context.attempt < 3:
        raise RuntimeError(f"attempt {context.attempt} fails")
    return context.attempt


@task
def explode():
    raise ValueError("boom")


def _record(signal_name):
    def receiver(sender, task_result, **kwargs):
        path = os.environ.get("EVERYSTEP_TEST_SIGNALS")
        if not path:
            return
        line = {
            "signal": signal_name,
            "id": task_result.id,
            "status": str(task_result.status),
            "task": task_result.task.module_path,
            "attempts": task_result.attempts,
        }
        with open(path, "a") as file:
            file.write(json.dumps(line) + "\n")

    return receiver


for _name in ("task_enqueued", "task_started", "task_finished"):
    getattr(signals, _name).connect(_record(_name), weak=False, dispatch_uid=f"tests-{_name}")
