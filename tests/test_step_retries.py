"""Step retry policies (§13): ``@step(retries=, backoff=, max_backoff=,
retry_on=)``. Short waits are slept in place; longer ones park the run
as a durable sleep does, and the engine's clock is moved instead of waited
for. The step's record keeps its attempts and the last error."""

import re
import time
import uuid

import pytest

from everystep import schedule, step
from everystep.core import retry_policy
from everystep.engine import runner, steps
from everystep.errors import EverystepError, SimulatedCrash
from everystep.models import Step, Workflow
from tests import workflows
from tests.helpers import WORKER, attempt

pytestmark = pytest.mark.django_db(transaction=True)

FLAKY = f"{workflows.Flaky.__module__}.Flaky"


def the_step(run, step_id="1"):
    return Step.objects.get(workflow_id=run.id, step_id=step_id)


def test_a_step_that_fails_twice_then_succeeds_is_recorded_once_with_its_attempts(calls):
    run = schedule(workflows.retried, 2)
    assert attempt() == Workflow.Status.COMPLETED
    run.refresh_from_db()
    assert run.result == 3
    assert calls["flaky"] == 3
    recorded = the_step(run)
    assert (recorded.status, recorded.attempts) == (Step.Status.DONE, 3)
    assert recorded.error["type"] == FLAKY and "call 2 failed" in recorded.error["message"]


def test_a_step_that_keeps_failing_fails_the_run_after_its_last_attempt(calls):
    run = schedule(workflows.retried, 10)
    assert attempt() == Workflow.Status.FAILED
    assert calls["flaky"] == 4  # the call and 3 retries
    recorded = the_step(run)
    assert (recorded.status, recorded.attempts) == (Step.Status.FAILED, 4)
    assert "call 4 failed" in recorded.error["message"]


@pytest.mark.parametrize(
    ("kind", "status", "tag"),
    [("wrong", Workflow.Status.FAILED, "wrong"), ("terminal", Workflow.Status.STOPPED, "terminal")],
)
def test_an_error_outside_retry_on_and_terminal_are_not_retried(calls, kind, status, tag):
    run = schedule(workflows.not_retried, kind)
    assert attempt() == status
    assert calls[tag] == 1
    assert the_step(run).attempts == 1


def test_a_long_wait_parks_the_run_and_the_retry_runs_when_due(calls, moved_clock):
    run = schedule(workflows.retried_durably, 1)
    assert attempt() == Workflow.Status.SCHEDULED
    run.refresh_from_db()
    waiting = the_step(run, "2")
    assert (waiting.status, waiting.attempts) == (Step.Status.RETRYING, 1)
    assert waiting.error["type"] == FLAKY
    retry_at = waiting.result
    assert run.run_at == retry_at
    # backoff 30 s, jittered down by up to a half
    seconds = (retry_at - moved_clock.moment).total_seconds()
    assert 15 <= seconds <= 30

    moved_clock.advance(seconds)
    assert attempt() == Workflow.Status.COMPLETED
    run.refresh_from_db()
    assert run.result == ["before", 2]
    assert (calls["before"], calls["slow"]) == (1, 2)
    done = the_step(run, "2")
    assert (done.status, done.attempts) == (Step.Status.DONE, 2)


def test_a_crash_after_the_retry_was_recorded_waits_on_to_the_same_time(calls, moved_clock):
    run = schedule(workflows.retried_durably, 1)
    assert attempt() == Workflow.Status.SCHEDULED
    retry_at = the_step(run, "2").result
    # What a crash before the run left its worker leaves: still claimed.
    Workflow.objects.filter(id=run.id).update(
        status=Workflow.Status.RUNNING, claimed_by=WORKER, claim_token=uuid.uuid4()
    )
    assert attempt(parked=True) == Workflow.Status.SCHEDULED
    assert Workflow.objects.get(id=run.id).run_at == retry_at
    assert calls["slow"] == 1


def test_an_unsafe_step_is_retried_after_it_raised(calls):
    run = schedule(workflows.retried_unsafe, 1)
    assert attempt() == Workflow.Status.COMPLETED
    assert calls["charge"] == 2
    recorded = the_step(run)
    assert (recorded.status, recorded.attempts) == (Step.Status.DONE, 2)


def test_an_unsafe_step_that_crashed_during_a_retry_blocks_the_run(calls):
    """Its first call raised (known); the process died during its second:
    that call's effect is uncertain, so it is not retried but blocked."""
    seen = []

    def crash_on_the_second_call(ctx, step_id, name):
        seen.append(step_id)
        if len(seen) == 2:
            raise SimulatedCrash(step_id)

    runner.fault = crash_on_the_second_call
    run = schedule(workflows.retried_unsafe, 5)
    assert attempt() == Workflow.Status.RUNNING
    assert the_step(run).status == Step.Status.STARTED
    runner.fault = None
    assert attempt(parked=True) == Workflow.Status.BLOCKED
    assert calls["charge"] == 2


def test_a_crash_during_an_unsafe_steps_wait_in_place_retries_it_on_resume(
    calls, monkeypatch, moved_clock
):
    """The unsafe step's first call raised (its outcome known, recorded as
    retrying with its retry time); the process died during the short wait
    before the next call. The attempt that takes the run back retries it."""

    class DiesWhileWaiting:
        monotonic = staticmethod(time.monotonic)

        @staticmethod
        def sleep(seconds):
            raise SimulatedCrash("died during the wait")

    monkeypatch.setattr(steps, "time", DiesWhileWaiting)
    run = schedule(workflows.retried_unsafe, 1)
    assert attempt() == Workflow.Status.RUNNING
    assert (the_step(run).status, calls["charge"]) == (Step.Status.RETRYING, 1)
    monkeypatch.undo()

    moved_clock.advance(1)
    assert attempt(parked=True) == Workflow.Status.COMPLETED
    assert calls["charge"] == 2
    assert (the_step(run).status, the_step(run).attempts) == (Step.Status.DONE, 2)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"retries": -1}, "retries must be a whole number"),
        ({"retries": "3"}, "retries must be a whole number"),
        ({"retries": 2, "backoff": -1}, "backoff must be a number of seconds"),
        ({"retries": 2, "backoff": 10, "max_backoff": 5}, "max_backoff (5) is less than backoff"),
        ({"retries": 2, "retry_on": ValueError("x")}, "retry_on must be an exception class"),
        ({"retries": 2, "retry_on": (KeyboardInterrupt,)}, "retry_on must be an exception class"),
    ],
)
def test_bad_retry_options_are_refused_when_the_step_is_decorated(options, message):
    with pytest.raises(EverystepError, match=re.escape(message)):

        @step(**options)
        def anything():
            pass


def test_the_waits_double_are_capped_and_jittered_down_by_at_most_a_half():
    policy = retry_policy.policy(retries=10, backoff=2, max_backoff=20)
    for attempt_number, full in [(1, 2), (2, 4), (3, 8), (4, 16), (5, 20), (9, 20)]:
        waits = [policy.wait(attempt_number) for _ in range(200)]
        assert all(full / 2 <= wait <= full for wait in waits)
        assert max(waits) - min(waits) > 0  # jittered


def test_a_step_with_retries_outside_a_workflow_is_a_plain_call(calls):
    with pytest.raises(workflows.Flaky):
        workflows.flaky("plain", 1)
    assert calls["plain"] == 1
