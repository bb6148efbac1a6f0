"""Messages to runs (§15): `send` stores one in the run's mailbox in the
caller's transaction, `receive` in a body consumes it exactly once, and a
run with nothing to receive parks — ``scheduled``, holding no worker —
until a message or its timeout makes it due.
"""

import datetime
import uuid

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from everystep import schedule, send, testing
from everystep.errors import EverystepError
from everystep.models import Message, Step, Workflow
from tests import wait_workflows
from tests.helpers import attempt, recorded_steps

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _calls():
    wait_workflows.CALLS.clear()


def row(run):
    return Workflow.objects.get(id=run.id)


def test_a_run_with_nothing_to_receive_parks_and_a_message_makes_it_due(moved_clock):
    run = schedule(wait_workflows.awaits_payment, 7)
    assert attempt() == "scheduled"
    parked = row(run)
    assert parked.wait_topic == "payment"
    assert parked.run_at.year == 9999  # no timeout: nothing but a message wakes it
    assert parked.claimed_by is None
    assert recorded_steps(run) == {"1": ("receive", "waiting", parked.run_at)}

    send(run.id, "payment", {"amount": 30})
    assert row(run).run_at == moved_clock.moment
    assert attempt() == "completed"
    done = row(run)
    assert done.result == {"order": 7, "paid": {"amount": 30}}
    [message] = Message.objects.filter(workflow_id=run.id)
    assert (message.consumed_by, message.payload) == ("1", {"amount": 30})
    assert recorded_steps(run)["1"] == ("receive", "done", {"amount": 30})


def test_a_message_sent_before_the_receive_waits_in_the_mailbox():
    run = schedule(wait_workflows.awaits_payment, 8)
    send(run.id, "refund", "not this topic")
    send(run.id, "payment", "first")
    send(run.id, "payment", "second")
    assert attempt() == "completed"
    assert row(run).result == {"order": 8, "paid": "first"}
    left = Message.objects.filter(workflow_id=run.id, consumed_by__isnull=True)
    assert sorted(left.values_list("payload", flat=True)) == ["not this topic", "second"]


def test_messages_are_received_oldest_first_each_once():
    run = schedule(wait_workflows.receives, "item", 3)
    for value in ("a", "b"):
        send(run.id, "item", value)
    assert attempt() == "scheduled"  # the third receive waits
    send(run.id, "item", "c")
    assert attempt() == "completed"
    assert row(run).result == ["a", "b", "c"]
    consumers = Message.objects.filter(workflow_id=run.id).order_by("id")
    assert list(consumers.values_list("consumed_by", flat=True)) == ["1", "2", "3"]


def test_a_receive_times_out_with_none_at_the_deadline_its_first_call_set(moved_clock):
    run = schedule(wait_workflows.awaits_payment, 9, 60)
    assert attempt() == "scheduled"
    deadline = moved_clock.moment + datetime.timedelta(seconds=60)
    assert row(run).run_at == deadline
    moved_clock.advance(30)
    # Woken early by a message on another topic? No: nothing made it due.
    send(run.id, "other", 1)
    assert row(run).run_at == deadline
    moved_clock.advance(30)
    assert attempt() == "completed"
    assert row(run).result == {"order": 9, "status": "cancelled: no payment in time"}
    assert recorded_steps(run)["1"] == ("receive", "done", None)
    # A payment now is too late: the run has ended and takes no messages.
    with pytest.raises(EverystepError, match=f"run {run.id} is completed: a run that has ended"):
        send(run.id, "payment", 1)


def test_a_message_sent_in_a_transaction_that_rolls_back_is_not_there():
    run = schedule(wait_workflows.awaits_payment, 10)
    assert attempt() == "scheduled"
    with pytest.raises(RuntimeError), transaction.atomic():
        send(run.id, "payment", "rolled back")
        raise RuntimeError("the view failed")
    assert not Message.objects.exists()
    assert row(run).run_at.year == 9999  # and it was not woken either


def test_sending_twice_with_one_key_stores_one_message():
    run = schedule(wait_workflows.receives, "item", 2, 0)
    send(run.id, "item", "once", idempotency_key="webhook-123")
    send(run.id, "item", "once again", idempotency_key="webhook-123")
    send(run.id, "item", "other", idempotency_key="webhook-124")
    assert Message.objects.filter(workflow_id=run.id).count() == 2
    assert attempt() == "completed"
    assert row(run).result == ["once", "other"]


def test_sending_is_one_statement_on_postgresql_and_an_update_and_an_insert_elsewhere():
    run = schedule(wait_workflows.awaits_payment, 11)
    assert attempt() == "scheduled"
    with CaptureQueriesContext(connection) as queries:
        send(run.id, "payment", 1)
    statements = [
        q["sql"].split()[0].upper()
        for q in queries.captured_queries
        if q["sql"].split()[0].upper() in ("INSERT", "UPDATE", "SELECT", "DELETE", "WITH")
    ]
    assert statements == (["WITH"] if connection.vendor == "postgresql" else ["UPDATE", "INSERT"])
    assert row(run).run_at.year < 9999  # and it woke the run


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda run: send(run.id, "bad topic", 1), "a message's topic must be 1 to 255 letters"),
        (lambda run: send(run.id, "", 1), "a message's topic must be"),
        (lambda run: send(run.id, "x" * 256, 1), "a message's topic must be"),
        (lambda run: send(run.id, "ok", object()), "cannot serialize"),
        (
            lambda run: send(run.id, "ok", "x" * (9 * 1024 * 1024)),
            "the payload of a message to run .* is 9.0 MiB encoded; everystep stores at most 8 MiB",
        ),
        (lambda run: send(uuid.uuid4(), "ok", 1), "no run"),
        (lambda run: send("not-a-uuid", "ok", 1), "'not-a-uuid' is not a run id"),
        (lambda run: send(run.id, "ok", 1, idempotency_key=""), "idempotency_key must be"),
    ],
)
def test_bad_sends_are_refused_with_one_clear_line(call, message):
    run = schedule(wait_workflows.awaits_payment, 12)
    with pytest.raises(EverystepError, match=message) as caught:
        call(run)
    assert "\n" not in str(caught.value)
    assert not Message.objects.exists()


def test_receive_outside_a_workflow_is_refused():
    from everystep import receive

    with pytest.raises(EverystepError, match=r"receive\(\) is a step of a workflow body"):
        receive("payment")
    with pytest.raises(EverystepError, match="a message's topic must be"):
        receive("no spaces")


def test_a_crash_after_the_message_is_taken_and_before_it_is_recorded_leaves_it_unconsumed():
    run = schedule(wait_workflows.awaits_payment, 13)
    send(run.id, "payment", "the one")

    with testing.crash_after("everystep.receive"):
        assert attempt() == "running"
    assert Message.objects.get().consumed_by is None
    assert not Step.objects.filter(workflow_id=run.id).exists()
    assert attempt(parked=True) == "completed"
    assert row(run).result == {"order": 13, "paid": "the one"}
    assert Message.objects.get().consumed_by == "1"


def test_a_crash_after_the_receive_is_recorded_replays_the_same_message():
    run = schedule(wait_workflows.awaits_payment, 14)
    send(run.id, "payment", "first")
    send(run.id, "payment", "second")

    with testing.crash_after("note"):
        assert attempt() == "running"
    assert attempt(parked=True) == "completed"
    assert row(run).result == {"order": 14, "paid": "first"}
    consumed = Message.objects.filter(consumed_by__isnull=False)
    assert list(consumed.values_list("payload", flat=True)) == ["first"]


def test_parallel_branches_receiving_one_topic_each_get_a_different_message():
    run = schedule(wait_workflows.receives_in_branches, 3)
    for value in ("a", "b", "c"):
        send(run.id, "item", value)
    assert attempt() == "completed"
    assert sorted(row(run).result) == ["a", "b", "c"]
    assert Message.objects.filter(consumed_by__isnull=True).count() == 0


def test_a_body_that_sends_sends_once_even_after_a_crash_before_its_record():
    receiver = schedule(wait_workflows.receives, "item", 2, 0, delay=3600)
    sender = schedule(wait_workflows.sends, str(receiver.id), "item", "hello")

    with testing.crash_after("everystep.send"):
        assert attempt() == "running"
    assert Message.objects.filter(workflow_id=receiver.id).count() == 1
    assert attempt(parked=True) == "completed"  # sends again, with the same key
    assert Message.objects.filter(workflow_id=receiver.id).count() == 1
    assert recorded_steps(sender)["1"] == ("send", "done", None)


def test_a_worker_keeps_no_wake_up_time_for_a_run_parked_without_a_deadline():
    """The notification of a parked run carries its due time, the year
    9999: a worker keeps it nowhere, so 10,000 parked runs cannot crowd out
    the due times that matter."""
    import time

    from everystep.worker.options import WorkerOptions
    from everystep.worker.wakeup import Wakeup

    wakeup = Wakeup(WorkerOptions())
    for _ in range(3):
        wakeup.notified(str(time.time() + 8e9))
    assert wakeup._due_times == []
    wakeup.notified(str(time.time() + 5))
    assert len(wakeup._due_times) == 1


def test_a_parked_run_says_what_it_waits_for(moved_clock):
    from everystep.db import reads

    receiver = schedule(wait_workflows.awaits_payment, 15, 90)
    parent = schedule(wait_workflows.parent, 1)
    sleeper = schedule(wait_workflows.awaits_payment, 16, delay=60)
    for _ in range(2):
        attempt()
    deadline = (moved_clock.moment + datetime.timedelta(seconds=90)).strftime("%Y-%m-%d %H:%M:%S")
    assert reads.waits_for(row(receiver)) == f"a message on payment, until {deadline}"
    child = Workflow.objects.get(parent_id=parent.id)
    assert reads.waits_for(row(parent)) == f"the end of run {child.id}, no deadline"
    due = (moved_clock.moment + datetime.timedelta(seconds=60)).strftime("%Y-%m-%d %H:%M:%S")
    assert reads.waits_for(row(sleeper)) == f"its time, {due}"
    assert reads.waits_for(row(child)) is None  # due now
    waiting = reads.runs_page(reads.RunFilter(waiting=True)).runs
    assert {run.id for run in waiting} == {receiver.id, parent.id}


def test_what_a_run_waits_for_is_cleared_as_its_wait_ends(moved_clock):
    """Only the runs waiting now hold what they wait for: the waiting
    gauge, and the waiting filter, count them from it."""
    from everystep.db import reads

    woken = schedule(wait_workflows.awaits_payment, 17)
    timed_out = schedule(wait_workflows.awaits_payment, 18, 30)
    cancelled = schedule(wait_workflows.awaits_payment, 19)
    for _ in range(3):
        assert attempt() == "scheduled"
    assert reads.queue_state().waiting == {"message": 3, "run": 0}
    send(woken.id, "payment", 1)
    assert row(woken).wait_topic is None  # woken: due now, waiting no more
    from everystep.control import actions

    actions.cancel(cancelled.id)
    assert row(cancelled).wait_topic is None
    moved_clock.advance(31)
    assert row(timed_out).wait_topic == "payment"  # due, not yet claimed
    from everystep.db import claims

    claimed = {run.fence.run_id for run in claims.claim("tests", 10)}
    assert claimed == {woken.id, timed_out.id}
    assert row(timed_out).wait_topic is None  # claimed: its wait is over
    assert reads.queue_state().waiting == {"message": 0, "run": 0}
