"""Control (§13): cancel a run, retry a failed one.

A scheduled (also sleeping or waiting to retry) or blocked run is
cancelled at once; a running one at its next step boundary: the step in
flight finishes and is recorded, no further step starts, and the runner
moves the run, fenced on its claim. A request that finds the run's worker
dead is honoured by whichever claim takes the run next.
"""

import io
import uuid

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from everystep import cancel, retry, schedule
from everystep.db import claims, runs
from everystep.errors import EverystepError
from everystep.models import Step, Workflow
from tests import workflows
from tests.helpers import attempt, blocked_payment, park, recorded_steps

pytestmark = pytest.mark.django_db(transaction=True)

CANCELLED = Workflow.Status.CANCELLED


def status_of(run):
    return Workflow.objects.get(id=run.id).status


# Cancel


def test_a_scheduled_run_is_cancelled_at_once_with_its_reason():
    run = schedule(workflows.quick, 1)
    assert cancel(run.id, reason="ordered twice") == CANCELLED
    run.refresh_from_db()
    assert (run.status, run.error["message"]) == (CANCELLED, "ordered twice")
    assert run.error["type"] == "everystep.errors.Cancelled"
    assert run.completed_at is not None
    assert claims.claim("tests", 8) == []


def test_a_sleeping_run_and_a_blocked_run_are_cancelled_at_once(calls, moved_clock):
    sleeping = schedule(workflows.sleeper, 3600)
    attempt()
    assert status_of(sleeping) == Workflow.Status.SCHEDULED
    assert cancel(sleeping.id) == CANCELLED
    moved_clock.advance(3600)
    assert claims.claim("tests", 8) == []
    assert calls["after"] == 0

    blocked = blocked_payment(calls)
    assert cancel(blocked.id) == CANCELLED
    assert status_of(blocked) == CANCELLED


def test_a_running_run_is_cancelled_after_its_step_in_flight_is_recorded(calls):
    """The first step cancels its own run while it runs: it still finishes
    and is recorded; the second step never starts."""
    run = schedule(workflows.cancels_itself)
    assert attempt() == CANCELLED
    run.refresh_from_db()
    assert run.status == CANCELLED
    assert recorded_steps(run) == {"1": ("cancel_my_run", Step.Status.DONE, "asked")}
    assert calls["after-cancel"] == 0


def test_a_cancel_learnt_in_one_branch_outranks_a_sleep_in_another():
    run = schedule(workflows.sleeps_while_a_branch_cancels)
    assert attempt() == CANCELLED
    assert status_of(run) == CANCELLED


def test_cancelling_a_running_run_only_asks_and_says_so():
    run = park(workflows.quick, 1, worker="busy")
    assert cancel(run.id) == Workflow.Status.RUNNING
    run.refresh_from_db()
    assert run.status == Workflow.Status.RUNNING and run.cancel_requested_at is not None


def test_a_cancel_asked_of_a_run_whose_worker_died_is_honoured_by_the_next_claim(calls):
    """The worker holding the run died after the request: its take-back (or
    an operator's requeue, then any claim) cancels the run without running
    a step."""
    taken_back = park(workflows.quick, 1, worker="tests")
    cancel(taken_back.id)
    assert attempt(parked=True) == CANCELLED

    requeued = park(workflows.quick, 2, worker="gone-for-good")
    cancel(requeued.id)
    runs.requeue_runs([requeued.id])
    assert status_of(requeued) == Workflow.Status.SCHEDULED
    assert attempt() == CANCELLED
    assert status_of(requeued) == CANCELLED
    assert calls["add"] == 0 and not Step.objects.exists()


@pytest.mark.parametrize("finished", ["completed", "failed", "stopped", "cancelled"])
def test_a_finished_run_cannot_be_cancelled(finished):
    run = Workflow.objects.create(name="tests.workflows.quick", args=[1], status=finished)
    with pytest.raises(EverystepError, match=f"run {run.id} is {finished}"):
        cancel(run.id)
    assert status_of(run) == finished


def test_cancel_of_an_unknown_or_malformed_id_says_so():
    with pytest.raises(EverystepError, match="no run"):
        cancel(uuid.uuid4())
    with pytest.raises(EverystepError, match="is not a run id"):
        cancel("not-an-id")


def test_manage_py_everystep_cancel():
    run = schedule(workflows.quick, 1)
    out = io.StringIO()
    call_command("everystep_cancel", str(run.id), "--reason", "no longer needed", stdout=out)
    assert "cancelled" in out.getvalue()
    assert status_of(run) == CANCELLED
    with pytest.raises(CommandError, match="is cancelled"):
        call_command("everystep_cancel", str(run.id))


# Retry a failed run


def test_retrying_a_failed_run_replays_its_done_steps_and_runs_the_failed_one_again(calls):
    run = schedule(workflows.fails_once_after_a_step)
    assert attempt() == Workflow.Status.FAILED
    assert recorded_steps(run)["2"][1] == Step.Status.FAILED

    assert retry(run.id) == Workflow.Status.SCHEDULED
    run.refresh_from_db()
    assert (run.status, run.error, run.completed_at) == (Workflow.Status.SCHEDULED, None, None)
    assert set(recorded_steps(run)) == {"1"}  # the failed step's record is gone

    assert attempt() == Workflow.Status.COMPLETED
    run.refresh_from_db()
    assert run.result == ["one", "two"]
    assert (calls["one"], calls["two"]) == (1, 2)


def test_retrying_keeps_an_unsafe_steps_unknown_outcome_and_blocks_on_it(calls):
    """An unsafe step started and the run failed before its outcome was
    written (it could not be stored): retrying must not charge again."""
    run = Workflow.objects.create(
        name=workflows.pay.__everystep_workflow__, args=[30], status=Workflow.Status.FAILED
    )
    Step.objects.create(
        workflow=run, step_id="1", name="tests.workflows.charge", status=Step.Status.STARTED
    )
    retry(run.id)
    assert recorded_steps(run)["1"][1] == Step.Status.STARTED
    assert attempt() == Workflow.Status.BLOCKED
    assert calls["charge"] == 0


def test_a_retried_run_is_not_cancelled_by_a_cancel_asked_before_it_failed():
    """Asked to cancel while it ran, it failed first; the retry is what the
    operator wants now: the old request does not cancel the new attempt."""
    run = Workflow.objects.create(
        name=workflows.quick.__everystep_workflow__,
        args=[1],
        status=Workflow.Status.FAILED,
        cancel_requested_at=timezone.now(),
    )
    retry(run.id)
    assert attempt() == Workflow.Status.COMPLETED


@pytest.mark.parametrize("status", ["scheduled", "running", "completed", "stopped", "blocked"])
def test_only_a_failed_run_can_be_retried(status):
    run = Workflow.objects.create(name="tests.workflows.quick", args=[1], status=status)
    with pytest.raises(EverystepError, match=f"run {run.id} is {status}, not failed"):
        retry(run.id)
    assert status_of(run) == status
