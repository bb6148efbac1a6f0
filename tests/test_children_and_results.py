"""Child runs, results and events (§15): `start` schedules a child once
across replays, `handle.result()` parks the parent until the child ends and
records what it ended with, `result()` waits from application code, and
`set_event` / `get_event` publish a run's progress.
"""

import asyncio
import threading
import time
import uuid

import pytest

from everystep import Terminal, aresult, get_event, result, schedule, start, testing
from everystep.control import actions
from everystep.engine import runner
from everystep.errors import Cancelled, EverystepError
from everystep.models import Event, Step, Workflow
from tests import wait_workflows, workflows
from tests.helpers import attempt, claim_one, recorded_steps

pytestmark = pytest.mark.django_db(transaction=True)


def row(run_id):
    return Workflow.objects.get(id=run_id)


def run_next():
    """Claim and run one due run; return (its id, the status it ended in)."""
    claimed = claim_one()
    return claimed.fence.run_id, runner.execute(claimed)


def children_of(run):
    return list(Workflow.objects.filter(parent_id=run.id))


# Child runs


def test_a_parent_waits_for_its_child_and_returns_its_result():
    parent = schedule(wait_workflows.parent, 21)
    assert run_next() == (parent.id, "scheduled")  # started the child, then parked
    [child] = children_of(parent)
    assert row(parent.id).wait_run == child.id
    assert child.status == "scheduled"
    assert run_next() == (child.id, "completed")
    assert row(parent.id).run_at.year < 9999  # woken by the child's end
    assert run_next() == (parent.id, "completed")
    assert row(parent.id).result == [str(child.id), 42]
    steps = recorded_steps(parent)
    assert steps["1"] == ("start", "done", child.id)
    assert steps["2"] == ("result", "done", 42)
    assert steps["3"] == ("note", "done", 42)


def test_a_child_that_ended_before_the_parent_waits_is_read_at_once():
    parent = schedule(wait_workflows.parent, 5)
    assert run_next() == (parent.id, "scheduled")
    [child] = children_of(parent)
    # The parent's wait is recorded; run the child, then check that the
    # parent is due, not parked for ever.
    assert run_next() == (child.id, "completed")
    assert run_next() == (parent.id, "completed")


def test_a_failed_child_raises_its_exception_in_the_parent_which_can_catch_it():
    parent = schedule(wait_workflows.parent_of_failure, "card declined")
    run_next()
    [child] = children_of(parent)
    assert run_next() == (child.id, "failed")
    assert run_next() == (parent.id, "completed")
    assert row(parent.id).result == "caught card declined"
    step = Step.objects.get(workflow_id=parent.id, step_id="2")
    assert (step.status, step.error["type"]) == ("failed", "builtins.ValueError")


def test_a_stopped_child_raises_terminal_in_the_parent():
    parent = schedule(wait_workflows.parent_of, "tests.wait_workflows.stops", ["out of stock"])
    run_next()
    [child] = children_of(parent)
    assert run_next() == (child.id, "stopped")
    assert run_next() == (parent.id, "completed")
    assert row(parent.id).result == ["terminal", "out of stock"]


def test_a_wait_for_a_child_times_out_with_a_recorded_timeout_error(moved_clock):
    parent = schedule(wait_workflows.parent_of, "tests.wait_workflows.waits_for_go", [], 60)
    assert run_next() == (parent.id, "scheduled")
    [child] = children_of(parent)
    assert run_next() == (child.id, "scheduled")  # the child waits for a message
    moved_clock.advance(61)
    assert run_next() == (parent.id, "completed")
    assert row(parent.id).result == ["timeout", str(child.id)]
    step = Step.objects.get(workflow_id=parent.id, step_id="2")
    assert (step.status, step.error["type"]) == ("failed", "builtins.TimeoutError")


def test_a_crash_after_the_child_is_inserted_and_before_the_start_is_recorded_starts_one_child():
    parent = schedule(wait_workflows.parent, 3)

    with testing.crash_after("everystep.start"):
        assert attempt() == "running"
    [child] = children_of(parent)  # inserted, its start not recorded
    assert not Step.objects.filter(workflow_id=parent.id).exists()
    assert runner.execute(claim_one(parked=True)) == "scheduled"
    assert [c.id for c in children_of(parent)] == [child.id]
    assert recorded_steps(parent)["1"] == ("start", "done", child.id)


def test_a_crash_after_the_result_is_recorded_replays_it_without_reading_the_child_again():
    parent = schedule(wait_workflows.parent, 4)
    run_next()
    [child] = children_of(parent)
    run_next()

    with testing.crash_after("note"):
        assert run_next() == (parent.id, "running")
    Workflow.objects.filter(id=child.id).update(result=999)  # a replay must not read it
    assert runner.execute(claim_one(parked=True)) == "completed"
    assert row(parent.id).result == [str(child.id), 8]


def test_cancelling_a_parent_cancels_its_unfinished_children_and_theirs():
    parent = schedule(wait_workflows.parent_of, "tests.wait_workflows.parent", [1])
    run_next()
    [child] = children_of(parent)
    run_next()  # the child starts a grandchild and waits for it
    [grandchild] = Workflow.objects.filter(parent_id=child.id)
    assert actions.cancel(parent.id) == "cancelled"
    statuses = {run: row(run).status for run in (parent.id, child.id, grandchild.id)}
    assert set(statuses.values()) == {"cancelled"}
    error = row(grandchild.id).error
    assert error["type"] == "everystep.errors.Cancelled"
    assert f"its parent run {child.id} was cancelled" in error["message"]


def test_a_cancelled_child_raises_cancelled_in_a_waiting_parent():
    parent = schedule(wait_workflows.parent, 2)
    run_next()
    [child] = children_of(parent)
    actions.cancel(child.id, "not needed")
    assert row(parent.id).run_at.year < 9999
    assert run_next() == (parent.id, "cancelled")
    assert row(parent.id).error["message"] == "not needed"


def test_start_outside_a_workflow_is_refused():
    with pytest.raises(EverystepError, match=r"start\(\) is a step of a workflow body"):
        start(wait_workflows.doubles, 1)
    with pytest.raises(TypeError, match="is not an @everystep.workflow"):
        start(print, 1)


# Results from application code


def test_result_returns_at_once_for_a_run_that_has_ended():
    run = schedule(wait_workflows.doubles, 5)
    attempt()
    assert result(run.id) == 10
    assert result(str(run.id), timeout=0) == 10
    assert run.get_result(timeout=1) == 10


def test_result_raises_what_the_run_ended_with():
    failing = schedule(wait_workflows.fails, "boom")
    attempt()
    with pytest.raises(ValueError, match="boom"):
        result(failing.id)
    stopping = schedule(wait_workflows.stops, "no stock")
    attempt()
    with pytest.raises(Terminal, match="no stock"):
        result(stopping.id)
    waiting = schedule(wait_workflows.waits_for_go)
    actions.cancel(waiting.id, "changed my mind")
    with pytest.raises(Cancelled, match="changed my mind"):
        result(waiting.id)


def test_result_times_out_and_refuses_an_unknown_run():
    run = schedule(wait_workflows.waits_for_go)
    began = time.monotonic()
    with pytest.raises(TimeoutError, match=f"run {run.id} had not ended after 0.3 s"):
        result(run.id, timeout=0.3)
    assert time.monotonic() - began < 5
    with pytest.raises(EverystepError, match="no run"):
        result(uuid.uuid4())
    with pytest.raises(EverystepError, match="is not a run id"):
        result("nope")


def test_result_waits_for_a_run_a_worker_ends(embedded_worker):
    run = schedule(wait_workflows.holds, 0.3)
    embedded_worker(name="results", pool_size=1)
    assert result(run.id, timeout=30) == 0.3


def test_aresult_waits_without_blocking_the_event_loop(embedded_worker):
    run = schedule(wait_workflows.holds, 0.3)
    embedded_worker(name="aresults", pool_size=1)

    async def main():
        ticks = 0

        async def tick():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.create_task(tick())
        value = await aresult(run.id, timeout=30)
        ticker.cancel()
        return value, ticks

    value, ticks = asyncio.run(main())
    assert value == 0.3
    assert ticks > 5


# Events


def test_events_publish_the_latest_value_for_anyone_to_read():
    run = schedule(wait_workflows.publishes, 3)
    assert get_event(run.id, "progress") is None
    attempt()
    assert get_event(run.id, "progress") == 2
    assert Event.objects.filter(workflow_id=run.id).count() == 3
    assert get_event(run.id, "other") is None
    with pytest.raises(EverystepError, match="no run"):
        get_event(uuid.uuid4(), "progress")
    with pytest.raises(EverystepError, match="an event's key must be"):
        get_event(run.id, "bad key")


def test_get_event_waits_for_a_first_value(embedded_worker):
    run = schedule(wait_workflows.publishes, 1, delay=0.5)
    embedded_worker(name="events", pool_size=1)
    assert get_event(run.id, "progress", timeout=30) == 0


def test_a_crash_after_events_are_set_does_not_set_them_again():
    run = schedule(wait_workflows.publishes, 2)
    with testing.crash_after("note"):  # the step after the two set_event
        assert attempt() == "running"
    assert list(Event.objects.filter(workflow_id=run.id).values_list("value", flat=True)) == [0, 1]
    assert attempt(parked=True) == "completed"
    assert Event.objects.filter(workflow_id=run.id).count() == 2
    assert row(run.id).result == "published"


def test_a_body_reads_another_runs_event_once_and_replays_it():
    source = schedule(wait_workflows.publishes, 1)
    attempt()
    reader = schedule(wait_workflows.reads_event, str(source.id))
    attempt()
    assert row(reader.id).result == 0
    assert recorded_steps(reader)["1"] == ("get_event", "done", 0)


def test_set_event_outside_a_workflow_is_refused():
    from everystep import set_event

    with pytest.raises(EverystepError, match=r"set_event\(\) is a step of a workflow body"):
        set_event("progress", 1)


def test_result_in_a_body_of_a_run_that_is_not_a_child_is_a_durable_wait():
    other = schedule(wait_workflows.waits_for_go)
    waiter = schedule(wait_workflows.waits_for, str(other.id))
    claimed = {c.fence.run_id: c for c in [claim_one(), claim_one()]}
    runner.execute(claimed[other.id])
    assert runner.execute(claimed[waiter.id]) == "scheduled"
    assert row(waiter.id).wait_run == other.id
    from everystep import send

    send(other.id, "go", "went")
    assert run_next() == (other.id, "completed")
    assert run_next() == (waiter.id, "completed")
    assert row(waiter.id).result == "went"


def test_a_thread_waiting_for_a_result_is_woken_by_the_end():
    from django.db import connections

    from everystep import send

    run = schedule(wait_workflows.waits_for_go)
    assert attempt() == "scheduled"
    got = []

    def wait():
        try:
            got.append(result(run.id, timeout=30))
        finally:
            connections.close_all()

    waiter = threading.Thread(target=wait)
    waiter.start()
    send(run.id, "go", "now")
    assert attempt() == "completed"
    waiter.join(30)
    assert got == ["now"]


def test_a_body_waiting_for_a_run_that_does_not_exist_fails_with_a_clear_error():
    missing = uuid.uuid4()
    run = schedule(wait_workflows.waits_for, str(missing))
    assert attempt() == "failed"
    error = row(run.id).error
    assert (error["type"], error["message"]) == (
        "everystep.errors.EverystepError",
        f"no run {missing}",
    )


@pytest.mark.backends("postgres")
def test_a_runs_end_is_notified_only_to_those_who_await_it():
    """PostgreSQL makes the commits that notify queue one behind another, so
    a run's end notifies ``everystep_ended`` only once a `result()` waiter
    listens for it (migration 0017); the ends of the other runs commit
    without it."""
    from django.db import DEFAULT_DB_ALIAS, connections

    from everystep.db import ends

    listening = connections.create_connection(DEFAULT_DB_ALIAS)
    listening.ensure_connection()
    listening.connection.autocommit = True
    listening.connection.execute(f"LISTEN {ends.CHANNEL}")
    unawaited = schedule(workflows.add_twice, 1, 2)
    awaited = schedule(workflows.add_twice, 3, 4)
    waiter = ends._Listener(awaited.id)  # as result() listens, then marks its run
    try:
        assert waiter.raw is not None
        assert {attempt(), attempt()} == {"completed"}
        notified = [
            notification.payload
            for notification in listening.connection.notifies(timeout=2, stop_after=2)
        ]
        assert notified == [str(awaited.id)]
        assert str(unawaited.id) not in notified
    finally:
        waiter.close()
        listening.close()
