"""Time (§13): a delayed start and a durable sleep, both one "not before"
rule on the run (``run_at``) that the claim obeys.

The engine's clock (`everystep.core.clock`) is moved by the tests instead of
waiting; the tests with a real worker use short real delays and wait on
the run's state with a deadline.
"""

import datetime
import time
import uuid

import pytest

from everystep import schedule
from everystep.db import claims
from everystep.errors import EverystepError, WorkflowCodeError
from everystep.models import Step, Worker, Workflow
from tests import workflows
from tests.helpers import WORKER, attempt, recorded_steps, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

UTC = datetime.UTC


def claimable():
    return claims.claim(WORKER, 10, [workflows.quick.__everystep_workflow__])


# Delayed start


def test_a_delayed_run_is_not_claimed_before_its_time(moved_clock):
    run = schedule(workflows.quick, 1, delay=90)
    assert run.run_at == moved_clock.moment + datetime.timedelta(seconds=90)
    moved_clock.advance(89)
    assert claimable() == []
    moved_clock.advance(1)
    [claimed] = claimable()
    assert claimed.fence.run_id == run.id
    assert claimed.due_at == run.run_at


def test_a_run_that_falls_due_while_the_worker_claims_is_claimed_at_once():
    """A worker notified of a run due later claims it when it falls due. If
    that moment passes while the worker is busy claiming (after it looked
    at its due times, before it waits again), its wait ends at once: the
    run is not left for a poll later."""
    from everystep.worker.options import WorkerOptions
    from everystep.worker.wakeup import Wakeup

    wakeup = Wakeup(WorkerOptions())
    wakeup.notified(str(time.time() + 0.05))
    wakeup.clear()  # the loop's turn begins,
    assert wakeup.take_notified() is None  # looks (not due yet) and claims
    time.sleep(0.06)  # the claim takes until the run is due
    began = time.monotonic()
    wakeup.wait(5.0)  # the poll's wait
    assert time.monotonic() - began < 1.0
    assert wakeup.take_notified() is not None


def test_run_at_and_a_timedelta_delay_set_the_same_rule(moved_clock):
    later = moved_clock.moment + datetime.timedelta(hours=2)
    by_time = schedule(workflows.quick, 1, run_at=later)
    by_delay = schedule(workflows.quick, 2, delay=datetime.timedelta(hours=2))
    assert Workflow.objects.get(id=by_time.id).run_at == later
    assert Workflow.objects.get(id=by_delay.id).run_at == later


def test_due_runs_are_claimed_longest_due_first_and_a_run_at_in_the_past_at_once(moved_clock):
    now = moved_clock.moment
    late = schedule(workflows.quick, 1, run_at=now - datetime.timedelta(minutes=5))
    fresh = schedule(workflows.quick, 2)
    later = schedule(workflows.quick, 3, delay=60)
    assert [
        run.fence.run_id
        for run in claims.claim(WORKER, 1, [workflows.quick.__everystep_workflow__])
    ] == [late.id]
    assert [run.fence.run_id for run in claimable()] == [fresh.id]
    moved_clock.advance(60)
    assert [run.fence.run_id for run in claimable()] == [later.id]


@pytest.mark.parametrize(
    ("when", "message"),
    [
        ({"run_at": datetime.datetime(2030, 1, 1, 12)}, "must be an aware datetime"),
        ({"run_at": "2030-01-01T12:00Z"}, "run_at must be a datetime, not str"),
        ({"delay": -1}, "delay must not be negative"),
        ({"delay": datetime.timedelta(seconds=-5)}, "delay must not be negative"),
        ({"delay": "90s"}, "delay must be a timedelta or a number of seconds, not str"),
        ({"delay": True}, "delay must be a timedelta or a number of seconds, not bool"),
        ({"delay": float("nan")}, "delay must be a finite number"),
        (
            {"delay": 5, "run_at": datetime.datetime(2030, 1, 1, tzinfo=UTC)},
            "give run_at or delay, not both",
        ),
    ],
)
def test_a_bad_time_is_refused_before_anything_is_written(when, message):
    with pytest.raises(EverystepError, match=message):
        schedule(workflows.quick, 1, **when)
    assert not Workflow.objects.exists()


def test_the_claim_reads_no_run_that_is_not_due_with_many_waiting(moved_clock):
    """With 20,000 runs due tomorrow in the table, the claim's read of the
    due ones stops at the first that is not due: it returns the few due
    runs and its plan reads the claim index by due time."""
    from django.db import connection

    tomorrow = moved_clock.moment + datetime.timedelta(days=1)
    name = workflows.quick.__everystep_workflow__
    Workflow.objects.bulk_create(
        [Workflow(name=name, args=[i], run_at=tomorrow) for i in range(20_000)], batch_size=2_000
    )
    due = [schedule(workflows.quick, i).id for i in range(3)]
    with connection.cursor() as cursor:
        cursor.execute(
            "ANALYZE" if connection.vendor != "mysql" else "ANALYZE TABLE everystep_workflow"
        )
    assert sorted(run.fence.run_id for run in claimable()) == sorted(due)
    assert claimable() == []


# Durable sleep


def test_a_sleeping_run_leaves_its_worker_and_wakes_without_running_its_steps_again(
    calls, moved_clock
):
    run = schedule(workflows.sleeper, 30)
    assert attempt() == Workflow.Status.SCHEDULED
    run.refresh_from_db()
    wake_at = moved_clock.moment + datetime.timedelta(seconds=30)
    assert (run.status, run.claimed_by, run.run_at) == (Workflow.Status.SCHEDULED, None, wake_at)
    assert recorded_steps(run) == {
        "1": ("counted", Step.Status.DONE, "before"),
        "2": ("sleep", Step.Status.DONE, wake_at),
    }
    assert claimable() == [] and claims.claim(WORKER, 1) == []

    moved_clock.advance(30)
    assert attempt() == Workflow.Status.COMPLETED
    run.refresh_from_db()
    assert run.result == ["before", "after"]
    assert (calls["before"], calls["after"]) == (1, 1)


def test_a_crash_after_the_sleep_was_recorded_sleeps_on_to_the_same_wake_time(moved_clock):
    """The process died between recording the sleep and leaving the worker:
    the run is still claimed (as a crash leaves it). The attempt that takes
    it back sleeps to the recorded time, not a new one."""
    run = schedule(workflows.sleeper, 30)
    assert attempt() == Workflow.Status.SCHEDULED
    wake_at = Workflow.objects.get(id=run.id).run_at
    # What the crash leaves: the sleep recorded, the run still held.
    Workflow.objects.filter(id=run.id).update(
        status=Workflow.Status.RUNNING,
        claimed_by=WORKER,
        claim_token=uuid.uuid4(),
        run_at=run.run_at,
    )
    moved_clock.advance(10)
    assert attempt(parked=True) == Workflow.Status.SCHEDULED
    assert Workflow.objects.get(id=run.id).run_at == wake_at
    assert Step.objects.filter(workflow_id=run.id).count() == 2


def test_a_named_sleep_takes_its_name_and_leaves_the_positions_alone(moved_clock):
    run = schedule(workflows.named_sleeper, 5)
    assert attempt() == Workflow.Status.SCHEDULED
    moved_clock.advance(5)
    assert attempt() == Workflow.Status.COMPLETED
    assert set(recorded_steps(run)) == {"nap", "1", "2"}


def test_a_sleep_in_a_branch_parks_the_run_once_the_fork_has_ended(calls, moved_clock):
    run = schedule(workflows.sleeps_in_a_branch, 5)
    assert attempt() == Workflow.Status.SCHEDULED
    assert recorded_steps(run)["1.1.1"][0] == "sleep"
    moved_clock.advance(5)
    assert attempt() == Workflow.Status.COMPLETED
    run.refresh_from_db()
    assert run.result == ("left", (None, "woke"))
    assert calls["left"] == 1


def test_a_step_where_a_sleep_was_recorded_is_a_code_change(moved_clock):
    run = schedule(workflows.sleeper, 5)
    attempt()
    Step.objects.filter(workflow_id=run.id, step_id="2").update(name="tests.workflows.counted")
    moved_clock.advance(5)
    assert attempt() == Workflow.Status.FAILED
    run.refresh_from_db()
    assert run.error["type"] == f"{WorkflowCodeError.__module__}.WorkflowCodeError"
    assert "now calls everystep.sleep there" in run.error["message"]


def test_outside_a_workflow_and_inside_a_step_sleep_is_time_sleep(calls):
    import everystep

    began = time.monotonic()
    everystep.sleep(0.05)
    assert time.monotonic() - began >= 0.05

    run = schedule(workflows.sleeps_inside_a_step, 0.05)
    assert attempt() == Workflow.Status.COMPLETED
    assert recorded_steps(run) == {"1": ("sleeps_inside", Step.Status.DONE, "slept")}


@pytest.mark.parametrize("duration", [-1, "5s", None])
def test_a_bad_sleep_duration_fails_the_run_with_a_clear_error(duration):
    import everystep

    with pytest.raises(EverystepError, match="the sleep's duration"):
        everystep.sleep(duration)
    run = schedule(workflows.sleeper, duration)
    assert attempt() == Workflow.Status.FAILED
    run.refresh_from_db()
    assert "the sleep's duration" in run.error["message"]


# With a real worker


def test_a_worker_frees_the_slot_of_a_sleeping_run_and_resumes_it_when_due(embedded_worker):
    """One pool slot: a run sleeping 1.5 s does not hold it, so a run
    scheduled after it completes first; then the sleeper wakes and ends."""
    sleeping = schedule(workflows.sleeper, 1.5)
    embedded_worker(name="sleepy", pool_size=1)
    wait_until(
        lambda: Step.objects.filter(workflow_id=sleeping.id, name="everystep.sleep").exists(),
        message="the run to record its sleep",
    )
    quick = schedule(workflows.quick, 1)
    wait_until(
        lambda: Workflow.objects.get(id=quick.id).status == "completed",
        message="the quick run to complete while the other sleeps",
    )
    assert Workflow.objects.get(id=sleeping.id).status == "scheduled"
    wait_until(
        lambda: Workflow.objects.get(id=sleeping.id).status == "completed",
        message="the sleeper to wake and complete",
    )
    done = Workflow.objects.get(id=sleeping.id)
    wake_at = Step.objects.get(workflow_id=sleeping.id, name="everystep.sleep").result
    assert done.completed_at >= wake_at


@pytest.mark.backends("postgres")
def test_on_postgresql_an_idle_worker_wakes_when_a_delayed_run_falls_due(embedded_worker):
    """The notification of a delayed run carries its due time: a worker
    polling only every 60 s takes a turn when the run falls due."""
    embedded_worker(name="notified", poll=60)
    wait_until(
        lambda: Worker.objects.filter(name="notified", state="ready").exists(),
        message="the worker to be ready",
    )
    run = schedule(workflows.quick, 1, delay=1.0)
    wait_until(
        lambda: Workflow.objects.get(id=run.id).status == "completed",
        timeout=20,
        message="the delayed run to complete well before the next poll",
    )
