"""Django's Tasks API on the everystep backend (SPEC §14): ``@task``
functions enqueued in the caller's transaction, run by real worker
processes, their results read back with Django's own API."""

import datetime
import json
import textwrap

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.utils import timezone

from everystep.models import Step, Workflow
from everystep.tasks import (
    EverystepBackend,
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultStatus,
)
from tests import task_functions, workflows
from tests.helpers import wait_until
from tests.test_runtime_commands import everystep, pyz_worker  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)

TASK_MODULES = {"EVERYSTEP_TEST_WORKFLOWS": "tests.workflows,tests.task_functions"}


@pytest.fixture
def signals_file(tmp_path, monkeypatch):
    """The file the test's and the workers' signal receivers append to."""
    path = tmp_path / "signals.jsonl"
    monkeypatch.setenv("EVERYSTEP_TEST_SIGNALS", str(path))
    return path


@pytest.fixture
def task_worker(spawn_worker, signals_file):
    """A worker of the task modules, ready; its signals go to `signals_file`."""
    env = {**TASK_MODULES, "EVERYSTEP_TEST_SIGNALS": str(signals_file)}
    return spawn_worker("tasks", "--pool", "4", "--poll", "0.05", env=env).wait_ready()


def finished(result, timeout=30):
    def done():
        result.refresh()
        return result.is_finished

    wait_until(done, timeout=timeout, message=f"task {result.id} finished")
    return result


def seen(signals_file):
    if not signals_file.exists():
        return []
    return [json.loads(line) for line in signals_file.read_text().splitlines()]


def test_the_backend_supports_what_spec_14_says():
    backend = task_functions.add.get_backend()
    assert isinstance(backend, EverystepBackend)
    assert backend.supports_defer and backend.supports_get_result
    assert backend.supports_priority and backend.supports_async_task


def test_enqueue_joins_the_callers_transaction(signals_file):
    with pytest.raises(RuntimeError), transaction.atomic():
        gone = task_functions.add.enqueue(1, 2)
        raise RuntimeError("the view failed")
    with pytest.raises(TaskResultDoesNotExist):
        task_functions.add.get_result(gone.id)
    with transaction.atomic():
        kept = task_functions.add.enqueue(1, 2)
    result = task_functions.add.get_result(kept.id)
    assert result.status == TaskResultStatus.READY
    assert (result.args, result.kwargs) == ([1, 2], {})
    assert result.enqueued_at is not None and result.started_at is None
    assert result.worker_ids == [] and result.errors == []
    run = Workflow.objects.get(id=kept.id)
    assert run.name == "tests.task_functions.add"
    assert [line["signal"] for line in seen(signals_file)] == ["task_enqueued", "task_enqueued"]


def test_a_worker_runs_tasks_and_get_result_reads_their_outcome(task_worker, signals_file):
    result = task_functions.add.enqueue(2, 3)
    email = task_functions.send_email.enqueue("ada@example.com", subject="hi")
    counted = task_functions.count_runs.enqueue()
    finished(result)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert result.worker_ids == ["tasks"] and result.attempts == 1
    assert result.started_at <= result.finished_at
    assert result.last_attempted_at is not None
    email = finished(task_functions.send_email.get_result(email.id))
    assert email.return_value == {"to": "ada@example.com", "subject": "hi"}
    assert (email.task.queue_name, email.task.priority) == ("emails", 10)
    assert Workflow.objects.filter(id=email.id, queue="emails", priority=10).exists()
    assert finished(counted).return_value >= 3  # an async function, on the worker's loop
    signals = [
        (line["signal"], line["status"]) for line in seen(signals_file) if line["id"] == result.id
    ]
    assert signals == [
        ("task_enqueued", "READY"),
        ("task_started", "RUNNING"),
        ("task_finished", "SUCCESSFUL"),
    ]


def test_a_task_takes_its_context_and_retries_with_the_backend_options(task_worker):
    introduced = finished(task_functions.introduce.enqueue("ada"))
    assert introduced.return_value == {"name": "ada", "attempt": 1, "id": introduced.id}
    flaky = finished(task_functions.flaky.enqueue())
    assert flaky.status == TaskResultStatus.SUCCESSFUL
    assert flaky.return_value == 3
    assert flaky.attempts == 3
    assert Step.objects.get(workflow_id=flaky.id).attempts == 3


def test_a_failing_task_reads_back_failed_with_its_error(task_worker, signals_file):
    result = finished(task_functions.explode.enqueue())
    assert result.status == TaskResultStatus.FAILED
    [error] = result.errors
    assert error.exception_class_path == "builtins.ValueError"
    assert error.exception_class is ValueError
    assert "boom" in error.traceback
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value
    statuses = [line["status"] for line in seen(signals_file) if line["id"] == result.id]
    assert statuses[-1] == "FAILED"


def test_run_after_defers_and_a_cancelled_task_reads_failed(task_worker):
    later = timezone.now() + datetime.timedelta(hours=1)
    deferred = task_functions.add.using(run_after=later).enqueue(1, 1)
    assert Workflow.objects.get(id=deferred.id).run_at == later
    from everystep import cancel

    cancel(deferred.id)
    assert task_functions.add.get_result(deferred.id).status == TaskResultStatus.FAILED


def test_django_refuses_what_its_contract_refuses_with_its_exceptions():
    with pytest.raises(InvalidTask, match="Queue 'reports' is not valid"):
        task_functions.add.using(queue_name="reports")
    with pytest.raises(InvalidTask, match="priority must be a whole number"):
        task_functions.add.using(priority=101)
    with pytest.raises(InvalidTask, match="run_after must be an aware datetime"):
        task_functions.add.using(run_after=datetime.datetime(2030, 1, 1))
    with pytest.raises(TaskResultDoesNotExist):
        task_functions.add.get_result("not-a-run-id")
    plain = Workflow.objects.create(name=workflows.quick.__everystep_workflow__, args=[1])
    with pytest.raises(TaskResultDoesNotExist):
        task_functions.add.get_backend().get_result(str(plain.id))


@pytest.mark.parametrize(
    "params, message",
    [
        ({"OPTIONS": {"retires": 3}}, "takes retries, backoff, not retires"),
        ({"OPTIONS": {"retries": -1}}, "retries must be a whole number >= 0"),
        ({"QUEUES": ["bad queue"]}, "must be 1 to 64 letters"),
    ],
)
def test_bad_backend_settings_are_refused_in_one_line(params, message):
    with pytest.raises(ImproperlyConfigured, match=message) as raised:
        EverystepBackend("broken", params)
    assert "\n" not in str(raised.value)


def test_aenqueue_and_aget_result_work_from_async_code():
    from asgiref.sync import async_to_sync

    async def view():
        result = await task_functions.add.aenqueue(4, 4)
        return await task_functions.add.aget_result(result.id)

    result = async_to_sync(view)()
    assert result.status == TaskResultStatus.READY and result.args == [4, 4]


SHOP_TASKS = textwrap.dedent(
    """
    try:
        from django.tasks import task
    except ImportError:  # Django 5.2: the django-tasks backport
        from django_tasks import task


    @task(queue_name="emails", priority=5)
    def confirm(order_id):
        return {"confirmed": order_id}
    """
)


def test_the_zipapp_runs_django_tasks_of_a_module_outside_the_repository(
    everystep,  # noqa: F811
    pyz_worker,  # noqa: F811
    tmp_path,
):
    (tmp_path / "shop_tasks.py").write_text(SHOP_TASKS)
    env = {"EVERYSTEP_WORKFLOWS": "shop_tasks", "EVERYSTEP_PATH": str(tmp_path)}
    enqueue = everystep(
        "manage",
        "shell",
        "-c",
        "import shop_tasks; print(shop_tasks.confirm.enqueue(42).id)",
        **env,
    )
    assert enqueue.returncode == 0, enqueue.stderr
    run_id = enqueue.stdout.strip().splitlines()[-1]
    run = Workflow.objects.get(id=run_id)
    assert (run.name, run.queue, run.priority) == ("shop_tasks.confirm", "emails", 5)
    pyz_worker("shop", **env).wait_ready()
    wait_until(lambda: Workflow.objects.get(id=run_id).status == "completed", timeout=60)
    read = everystep(
        "manage",
        "shell",
        "-c",
        f"import shop_tasks; r = shop_tasks.confirm.get_result('{run_id}'); "
        "print(r.status, r.return_value)",
        **env,
    )
    assert read.returncode == 0, read.stderr
    assert read.stdout.strip().splitlines()[-1] == "SUCCESSFUL {'confirmed': 42}"
