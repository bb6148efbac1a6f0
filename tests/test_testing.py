"""`everystep.testing` as a project's tests use it: runs scheduled in a
`TestCase`'s open transaction, a `TransactionTestCase` and pytest-django's
fixtures run to their end on the test's thread; `crash_after` leaves a run
as a killed worker would, and the next call resumes it."""

import datetime
import threading

import pytest
from django.test import TestCase, TransactionTestCase

from everystep import schedule, testing
from everystep.errors import EverystepError
from everystep.models import Workflow
from tests import workflows

HOUR = datetime.timedelta(hours=1)


def ends(runs):
    return [(run.name.rsplit(".", 1)[-1], run.status) for run in runs]


class InATestCase(TestCase):
    """Everything here runs inside the test's transaction, rolled back after."""

    def test_a_run_the_test_scheduled_runs_to_its_end(self):
        run = schedule(workflows.add_twice, 1, 2)
        ran = testing.run_scheduled()
        self.assertEqual(ends(ran), [("add_twice", "completed")])
        run.refresh_from_db()
        self.assertEqual((run.status, run.result), ("completed", 5))
        self.assertEqual(testing.run_scheduled(), [])  # nothing left to run

    def test_parallel_branches_run_inside_the_test_transaction(self):
        run = schedule(workflows.nested_forks, 4)
        testing.run_scheduled()
        run.refresh_from_db()
        self.assertEqual((run.status, run.result), ("completed", 5))
        self.assertEqual(run.steps.count(), 7)

    def test_no_thread_is_left_behind(self):
        before = set(threading.enumerate())
        schedule(workflows.fork_ids)
        testing.run_scheduled()
        alive = [t for t in set(threading.enumerate()) - before if t.name != "everystep-deadline"]
        self.assertEqual(alive, [])

    def test_a_failure_is_recorded_with_its_traceback(self):
        run = schedule(workflows.failing_body)
        testing.run_scheduled()
        run.refresh_from_db()
        self.assertEqual(run.status, "failed")
        self.assertIn("Traceback (most recent call last)", run.error["traceback"])
        self.assertIn("tests/workflows.py", run.error["traceback"])

    def test_a_step_failing_on_a_database_error_is_recorded_and_the_test_goes_on(self):
        run = schedule(workflows.inserts_twice, "order-1")
        ran = testing.run_scheduled()
        self.assertEqual(ends(ran), [("inserts_twice", "failed")])
        run.refresh_from_db()
        self.assertIn("IntegrityError", run.error["type"])
        # The step's own writes rolled back; the test's transaction is usable.
        self.assertFalse(Workflow.objects.filter(idempotency_key="order-1").exists())
        self.assertEqual(run.steps.get().status, "failed")

    def test_a_step_inside_the_workflows_own_atomic_block_is_still_refused(self):
        run = schedule(workflows.charges_inside_atomic, 5)
        testing.run_scheduled()
        run.refresh_from_db()
        self.assertEqual(run.status, "failed")
        self.assertIn("inside transaction.atomic()", run.error["message"])

    def test_a_sleep_waits_for_until_and_no_longer(self):
        run = schedule(workflows.sleeper, 2 * 3600)
        testing.run_scheduled()
        run.refresh_from_db()
        self.assertEqual(run.status, "scheduled")  # asleep: not due yet
        testing.run_scheduled(until=HOUR)
        run.refresh_from_db()
        self.assertEqual(run.status, "scheduled")  # an hour is not enough
        ran = testing.run_scheduled(until=3 * HOUR)
        self.assertEqual(ends(ran), [("sleeper", "completed")])
        self.assertEqual(workflows.calls, {"before": 1, "after": 1})

    def test_a_delayed_start_comes_due_with_until(self):
        later = schedule(workflows.add_twice, 2, 2, delay=HOUR)
        now = schedule(workflows.add_twice, 1, 1)
        self.assertEqual([r.id for r in testing.run_scheduled()], [now.id])
        self.assertEqual([r.id for r in testing.run_scheduled(until=2 * HOUR)], [later.id])

    def test_a_crash_after_a_step_leaves_the_run_running_and_the_next_call_resumes_it(self):
        run = schedule(workflows.add_twice, 1, 2)
        with testing.crash_after(workflows.add):
            ran = testing.run_scheduled()
        self.assertEqual(ends(ran), [("add_twice", "running")])
        self.assertEqual(run.steps.count(), 0)  # the step ran; its outcome was lost
        ran = testing.run_scheduled()
        self.assertEqual(ends(ran), [("add_twice", "completed")])
        self.assertEqual(workflows.calls, {"add": 3})  # the first add ran twice

    def test_a_crash_after_an_unsafe_step_blocks_the_run(self):
        run = schedule(workflows.pay, 30)
        with testing.crash_after("charge"):
            testing.run_scheduled()
        testing.run_scheduled()
        run.refresh_from_db()
        self.assertEqual(run.status, "blocked")
        self.assertEqual(workflows.calls, {"charge": 1})  # never charged twice

    def test_nested_crash_after_blocks_each_crash_their_own_step(self):
        adding = schedule(workflows.add_twice, 1, 2)
        paying = schedule(workflows.pay, 5)
        with testing.crash_after("charge"), testing.crash_after("add"):
            testing.run_scheduled()
        self.assertEqual(
            sorted(ends(Workflow.objects.filter(id__in=[adding.id, paying.id]))),
            [("add_twice", "running"), ("pay", "running")],
        )

    def test_crash_after_a_step_that_never_ran_fails_the_test(self):
        schedule(workflows.add_twice, 1, 2)
        with self.assertRaisesRegex(AssertionError, "no such step ran"):
            with testing.crash_after("charge"):
                testing.run_scheduled()


class InATransactionTestCase(TransactionTestCase):
    """Committed runs, as a worker would see them."""

    def test_a_run_runs_to_its_end_and_a_crash_resumes(self):
        run = schedule(workflows.pay, 12)
        with testing.crash_after("2"):
            testing.run_scheduled()
        ran = testing.run_scheduled()
        self.assertEqual(ends(ran), [("pay", "completed")])
        run.refresh_from_db()
        self.assertEqual(run.result, {"charged": 12})
        self.assertEqual(workflows.calls, {"charge": 1, "echo": 2})

    def test_parallel_branches_record_their_steps_with_committed_data_too(self):
        run = schedule(workflows.nested_forks, 4)
        testing.run_scheduled()
        run.refresh_from_db()
        self.assertEqual((run.status, run.steps.count()), ("completed", 7))


def test_under_pytest_django_db(db):
    run = schedule(workflows.nested_forks, 1)
    assert ends(testing.run_scheduled()) == [("nested_forks", "completed")]
    run.refresh_from_db()
    assert run.result == 2


def test_under_pytest_django_transactional_db(transactional_db):
    run = schedule(workflows.sleeper, 60)
    testing.run_scheduled(until=datetime.datetime.now(datetime.UTC) + HOUR)
    run.refresh_from_db()
    assert run.result == ["before", "after"]


def test_a_workflow_that_never_ends_is_stopped_with_one_clear_error(db):
    schedule(workflows.sleeper, 60)
    schedule(workflows.sleeper, 60)
    with pytest.raises(EverystepError, match="stopped after 2 attempts"):
        testing.run_scheduled(until=HOUR, max_attempts=2)


def test_run_scheduled_holds_the_queues_rate_as_a_worker_would(db):
    """The queues of the test's modules are declared: of 6 runs of a queue
    allowing 4 starts in 2 s, 4 run and 2 stay scheduled."""
    from tests import queue_workflows

    run_ids = [schedule(queue_workflows.metered).id for _ in range(6)]
    ran = testing.run_scheduled()
    assert [run.id for run in ran] == run_ids[:4]
    assert Workflow.objects.filter(id__in=run_ids, status="scheduled").count() == 2
