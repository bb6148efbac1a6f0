"""everystep in a fresh Django project, as a new user meets it: the worker
shows what it does without any logging configured (and keeps the
project's own when it has some), failures carry their traceback, the
project's own tests run workflows with `everystep.testing` (Django's runner
and pytest-django), the system checks name what is missing, and a worker
started before the migrations waits for them when told to."""

import json
import re
import signal
import sys

import pytest

from tests.helpers import wait_until

ISO_TIME = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d"


def start_worker(project, spawn_process, *args):
    command = [sys.executable, "manage.py", "everystep_worker", "--name", "w1", *args]
    return spawn_process("worker", command, env=project.env, cwd=project.path)


def test_the_worker_shows_its_ready_line_claims_and_ends_with_times_and_levels(
    fresh_project, spawn_process
):
    project = fresh_project()
    project.must("migrate")
    done, failed = project.schedule([1, "lamp", 5], [2, "desk", -1])
    worker = start_worker(project, spawn_process)
    worker.wait_for_log(f"run {done} orders.workflows.fulfil completed")
    worker.wait_for_log(f"run {failed} orders.workflows.fulfil failed")
    log = worker.log()
    assert re.search(rf"^{ISO_TIME} INFO +everystep: worker w1 ready", log, re.M), log
    assert re.search(rf"^{ISO_TIME} INFO +everystep: worker w1 claimed", log, re.M), log
    failure = log[log.rindex("\n", 0, log.index(f"run {failed} orders.workflows.fulfil failed")) :]
    assert re.match(rf"\n{ISO_TIME} WARNING everystep: run {failed} ", failure), failure
    assert "Traceback (most recent call last)" in failure
    assert 'orders/workflows.py", line' in failure and "in charge" in failure
    assert "ValueError: cannot charge -1" in failure
    worker.send(signal.SIGTERM)
    assert worker.wait() == 0


def test_the_worker_honours_the_log_format_and_level_variables(fresh_project, spawn_process):
    """``EVERYSTEP_LOG_FORMAT=json`` and ``EVERYSTEP_LOG_LEVEL=DEBUG`` work
    for ``manage.py everystep_worker`` as for the standalone worker; a value
    that is neither is refused in one line, exit status 2."""
    project = fresh_project()
    project.must("migrate")
    (run,) = project.schedule([4, "lamp", 1])
    command = [sys.executable, "manage.py", "everystep_worker", "--name", "w1"]
    env = {**project.env, "EVERYSTEP_LOG_FORMAT": "json", "EVERYSTEP_LOG_LEVEL": "debug"}
    worker = spawn_process("worker", command, env=env, cwd=project.path)
    worker.wait_for_log(f"run {run} orders.workflows.fulfil completed")
    worker.send(signal.SIGTERM)
    assert worker.wait() == 0
    lines = [json.loads(line) for line in worker.log().splitlines() if line.startswith("{")]
    actions = {line.get("action"): line for line in lines}
    assert actions["run_completed"]["level"] == "INFO"
    assert actions["run_completed"]["run_id"] == run
    assert actions["attempt_started"]["level"] == "DEBUG"  # shown at DEBUG only
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)

    env["EVERYSTEP_LOG_FORMAT"] = "xml"
    refused = spawn_process("refused", command, env=env, cwd=project.path)
    assert refused.wait() == 2
    assert "EVERYSTEP_LOG_FORMAT='xml' is not one of: text, json" in refused.log()
    assert "Traceback" not in refused.log()


def test_a_project_that_configures_logging_keeps_its_own(fresh_project, spawn_process):
    project = fresh_project()
    project.add_settings(
        """
        LOGGING = {
            "version": 1,
            "formatters": {"mine": {"format": "PROJECT %(levelname)s %(name)s %(message)s"}},
            "handlers": {"out": {"class": "logging.StreamHandler", "formatter": "mine"}},
            "root": {"handlers": ["out"], "level": "INFO"},
        }
        """
    )
    project.must("migrate")
    (run,) = project.schedule([3, "lamp", 1])
    worker = start_worker(project, spawn_process)
    worker.wait_for_log(f"PROJECT INFO everystep run {run} orders.workflows.fulfil completed")
    worker.send(signal.SIGTERM)
    assert worker.wait() == 0
    assert not re.search(rf"^{ISO_TIME} ", worker.log(), re.M)  # no second handler of ours


PROJECT_TESTS = """
import threading
import time

from django.test import TestCase, TransactionTestCase

from everystep import schedule, testing
from everystep.worker import Worker
from orders.workflows import charge, fulfil


class FulfilTests(TestCase):
    def test_an_order_is_fulfilled(self):
        run = schedule(fulfil, 7, "lamp", 30)
        testing.run_scheduled()
        run.refresh_from_db()
        self.assertEqual(run.status, "completed")
        self.assertEqual(run.result["sent"], ["mail:7", "sms:7"])

    def test_a_declined_charge_fails_the_run(self):
        run = schedule(fulfil, 8, "lamp", -1)
        testing.run_scheduled()
        run.refresh_from_db()
        self.assertEqual(run.status, "failed")
        self.assertIn("cannot charge -1", run.error["message"])

    def test_a_crash_after_the_charge_resumes_without_losing_it(self):
        run = schedule(fulfil, 9, "desk", 12)
        with testing.crash_after(charge):
            testing.run_scheduled()
        run.refresh_from_db()
        self.assertEqual(run.status, "running")
        testing.run_scheduled()
        run.refresh_from_db()
        self.assertEqual(run.status, "completed")


class CommittedTests(TransactionTestCase):
    def test_an_order_is_fulfilled(self):
        run = schedule(fulfil, 10, "chair", 4)
        testing.run_scheduled()
        run.refresh_from_db()
        self.assertEqual(run.result["charged"], 4)

    def test_an_embedded_worker_runs_a_committed_run(self):
        run = schedule(fulfil, 13, "lamp", 2)
        worker = Worker(name="embedded", poll=0.05)
        thread = threading.Thread(target=worker.run)
        thread.start()
        deadline = time.monotonic() + 30
        while run.status != "completed" and time.monotonic() < deadline:
            time.sleep(0.05)
            run.refresh_from_db()
        worker.stop()
        thread.join(30)
        self.assertEqual(run.status, "completed")
"""

PYTEST_TESTS = """
from everystep import schedule, testing
from orders.workflows import fulfil


def test_with_the_db_fixture(db):
    run = schedule(fulfil, 11, "lamp", 2)
    (ran,) = testing.run_scheduled()
    assert (ran.id, ran.status) == (run.id, "completed")


def test_with_the_transactional_db_fixture(transactional_db):
    schedule(fulfil, 12, "lamp", 3)
    assert [r.status for r in testing.run_scheduled()] == ["completed"]
"""


def test_the_projects_own_tests_run_workflows_with_everystep_testing(fresh_project):
    project = fresh_project()
    project.write("orders/tests.py", PROJECT_TESTS)
    before = project.files()

    result = project.manage("test", "orders", "--noinput", "-v", "2")
    assert result.returncode == 0, result.stderr
    assert "Ran 5 tests" in result.stderr and "OK" in result.stderr
    assert "database table is locked" not in result.stderr

    project.write(
        "pytest.ini",
        "[pytest]\nDJANGO_SETTINGS_MODULE = mysite.settings\npython_files = tests.py test_*.py\n",
    )
    project.write("orders/test_pytest.py", PYTEST_TESTS)
    before += ["orders/test_pytest.py", "pytest.ini"]
    pytest_run = project.run_module("pytest", "-q", "-p", "no:cacheprovider", "orders")
    assert pytest_run.returncode == 0, pytest_run.stdout + pytest_run.stderr
    assert "7 passed" in pytest_run.stdout
    # Nothing left behind: no worker's lock file beside the in-memory test
    # database (SQLite), no database file.
    assert project.files() == sorted(before)


def test_the_system_checks_name_a_missing_workflows_module_in_one_line(fresh_project):
    project = fresh_project()
    project.add_settings('EVERYSTEP_WORKFLOWS = ["orders.flows"]\n')
    result = project.manage("check", "--deploy")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert (
        "(everystep.E001) cannot import workflow module orders.flows: "
        "ModuleNotFoundError: No module named 'orders.flows'" in result.stderr
    )
    worker = project.manage("everystep_worker", timeout=60)
    assert worker.returncode == 2 and "Traceback" not in worker.stderr
    assert worker.stderr.strip().splitlines() == [
        "CommandError: cannot import workflow module orders.flows: "
        "ModuleNotFoundError: No module named 'orders.flows'"
    ]


def test_the_system_checks_warn_when_no_workflow_is_registered(fresh_project):
    project = fresh_project(workflows_module=False)
    result = project.must("check")
    assert "(everystep.W001) no everystep workflows are registered" in result.stderr


@pytest.mark.backends("sqlite")
def test_the_system_checks_warn_of_sqlite_without_wal_or_immediate_transactions(fresh_project):
    plain = fresh_project(sqlite_options=False)
    warned = plain.must("check").stderr
    assert "(everystep.W002) database 'default' is SQLite without the WAL journal and " in warned
    assert '"transaction_mode": "IMMEDIATE"' in warned  # the hint is the fix


@pytest.mark.backends("sqlite")
def test_the_readmes_sqlite_settings_pass_the_checks(fresh_project):
    project = fresh_project()
    checked = project.manage("check", "--deploy")  # Django's own deploy findings fail it
    assert "System check identified" in checked.stderr
    assert "everystep." not in checked.stderr


@pytest.mark.backends("postgres")
def test_check_deploy_hints_at_prepared_statements_on_postgresql(fresh_project):
    project = fresh_project()
    hinted = project.manage("check", "--deploy").stderr
    assert "(everystep.I001) database 'default' is PostgreSQL without server-side binding" in hinted
    project.add_settings(
        'DATABASES["default"]["OPTIONS"] = {"server_side_binding": True, "prepare_threshold": 5}\n'
    )
    assert "everystep.I001" not in project.manage("check", "--deploy").stderr


def test_a_worker_started_before_the_migrations_refuses_or_waits_for_them(
    fresh_project, spawn_process
):
    project = fresh_project()
    refused = project.manage("everystep_worker", "--name", "early", timeout=60)
    assert refused.returncode == 2, refused.stderr
    assert (
        refused.stderr.strip().splitlines()[-1].startswith("CommandError: the database has ")
        and "run `python manage.py migrate` first" in refused.stderr
    )
    gave_up = project.manage("everystep_worker", "--wait-for-migrations", "1", timeout=60)
    assert gave_up.returncode == 2
    assert "after waiting 1s: run `python manage.py migrate`" in gave_up.stderr

    worker = start_worker(project, spawn_process, "--wait-for-migrations", "120")
    worker.wait_for_log("waiting up to 120s for `python manage.py migrate`")
    project.must("migrate")
    worker.wait_ready()
    (run,) = project.schedule([5, "lamp", 1])
    worker.wait_for_log(f"run {run} orders.workflows.fulfil completed")
    worker.send(signal.SIGTERM)
    assert worker.wait() == 0


def test_sigterm_while_waiting_for_migrations_exits_at_once(fresh_project, spawn_process):
    project = fresh_project()
    worker = start_worker(project, spawn_process, "--wait-for-migrations", "600")
    worker.wait_for_log("waiting up to 600s")
    worker.send(signal.SIGTERM)
    assert worker.wait(timeout=15) == 0
    wait_until(lambda: not worker.alive(), timeout=5)


def test_a_new_projects_django_tasks_run_on_everystep_workers(fresh_project, spawn_process):
    """A project made by startproject points TASKS at everystep, writes
    ``@task`` functions in an app's ``tasks`` module, enqueues one from its
    own code, and reads the result back with Django's API once its worker
    (which found the module by itself) has run it."""
    project = fresh_project()
    project.add_settings(
        """
        TASKS = {
            "default": {
                "BACKEND": "everystep.tasks.EverystepBackend",
                "QUEUES": ["default", "emails"],
                "OPTIONS": {"retries": 2, "backoff": 0.0},
            }
        }
        """
    )
    project.write(
        "orders/tasks.py",
        """
        try:
            from django.tasks import task
        except ImportError:
            from django_tasks import task


        @task(queue_name="emails", priority=20, takes_context=True)
        def send_receipt(context, order_id):
            if context.attempt == 1:
                raise ConnectionError("the mail server hung up")
            return {"order": order_id, "attempt": context.attempt}
        """,
    )
    project.must("migrate")
    enqueued = project.must(
        "shell",
        "-c",
        "from django.db import transaction\n"
        "from orders.tasks import send_receipt\n"
        "with transaction.atomic():\n"
        "    print('TASK', send_receipt.enqueue(7).id)\n",
    ).stdout
    [task_id] = [line.split()[1] for line in enqueued.splitlines() if line.startswith("TASK ")]
    worker = start_worker(project, spawn_process, "--queue", "emails")
    worker.wait_for_log(f"run {task_id} orders.tasks.send_receipt completed")
    read = project.must(
        "shell",
        "-c",
        "from orders.tasks import send_receipt\n"
        f"r = send_receipt.get_result({task_id!r})\n"
        "print('RESULT', r.status, r.return_value['attempt'], r.attempts, r.task.queue_name)\n",
    ).stdout
    assert "RESULT SUCCESSFUL 2 2 emails" in read
    worker.send(signal.SIGTERM)
    assert worker.wait() == 0
