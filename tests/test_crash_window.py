"""The crash window (§3, §5): a step whose effect ran but whose record did
not; unsafe-to-repeat steps; resolving a blocked run."""

import io

import pytest
from django.core.management import CommandError, call_command

from everystep import schedule
from everystep.control.actions import resolve_step
from everystep.core import serde
from everystep.engine import runner
from everystep.errors import EffectUncertain, EverystepError
from everystep.models import Step, Workflow
from tests import workflows
from tests.helpers import WORKER, attempt, blocked_payment, crash_at

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_crash_between_effect_and_record_leaves_the_run_running_and_the_step_unrecorded(calls):
    runner.fault = crash_at("1")
    run = schedule(workflows.add_twice, 1, 2)
    assert attempt() == Workflow.Status.RUNNING
    run.refresh_from_db()
    assert (run.status, run.claimed_by) == (Workflow.Status.RUNNING, WORKER)
    assert not run.steps.exists()
    assert calls["add"] == 1

    runner.fault = None
    assert attempt(parked=True) == Workflow.Status.COMPLETED
    assert calls["add"] == 3  # the unrecorded step ran again on resume


def test_an_unsafe_step_that_lost_its_outcome_blocks_the_run_with_effect_uncertain(calls):
    run = blocked_payment(calls)
    assert run.status == Workflow.Status.BLOCKED
    error = serde.decode_exception(run.error)
    assert isinstance(error, EffectUncertain)
    assert error.step_id == "1"
    assert "resolve it with python manage.py everystep_resolve_step" in run.error["message"]


def test_resolving_with_a_result_records_it_and_the_run_completes_without_a_second_charge(calls):
    run = blocked_payment(calls)
    out = io.StringIO()
    call_command(
        "everystep_resolve_step", str(run.id), "1", "--result", '{"charged": 30}', stdout=out
    )
    assert "scheduled again" in out.getvalue()
    run.refresh_from_db()
    assert (run.status, run.claimed_by, run.error) == (Workflow.Status.SCHEDULED, None, None)

    assert attempt() == Workflow.Status.COMPLETED
    run.refresh_from_db()
    assert run.result == {"charged": 30}
    assert calls["charge"] == 1


def test_resolving_with_an_error_records_a_failure_and_the_run_fails(calls):
    run = blocked_payment(calls)
    call_command(
        "everystep_resolve_step", str(run.id), "1", "--error", "card declined", stdout=io.StringIO()
    )
    assert run.steps.get(step_id="1").status == Step.Status.FAILED

    assert attempt() == Workflow.Status.FAILED
    run.refresh_from_db()
    assert run.error["type"] == "everystep.errors.StepFailure"
    assert run.error["message"] == "card declined"
    assert calls["charge"] == 1


def test_resolving_by_discarding_runs_the_step_again(calls):
    run = blocked_payment(calls)
    call_command("everystep_resolve_step", str(run.id), "1", "--discard", stdout=io.StringIO())
    assert not run.steps.filter(step_id="1").exists()

    assert attempt() == Workflow.Status.COMPLETED
    run.refresh_from_db()
    assert run.result == {"charged": 30}
    assert calls["charge"] == 2


def test_a_started_step_no_longer_marked_unsafe_runs_again_and_is_completed_in_place(calls):
    runner.fault = crash_at("1")
    run = schedule(workflows.pay, 30)
    attempt()
    started_row = run.steps.get(step_id="1")

    @workflows.workflow
    def pay(amount):  # the new code: charge became safe to repeat
        return workflows.echo(amount)

    Step.objects.filter(id=started_row.id).update(name=workflows.echo.__everystep_step__)
    Workflow.objects.filter(id=run.id).update(name=pay.__everystep_workflow__)
    runner.fault = None
    assert attempt(parked=True) == Workflow.Status.COMPLETED
    row = run.steps.get(step_id="1")
    assert (row.id, row.status, row.result) == (started_row.id, Step.Status.DONE, 30)


def test_resolving_is_refused_for_anything_but_a_blocked_runs_started_step(calls):
    run = blocked_payment(calls)
    with pytest.raises(EverystepError, match="step 2 .* not recorded"):
        resolve_step(run.id, "2", discard=True)

    finished = schedule(workflows.add_twice, 1, 1)
    attempt()
    with pytest.raises(EverystepError, match="completed, not blocked"):
        resolve_step(finished.id, "1", result=2)

    with pytest.raises(CommandError, match="not a run id"):
        call_command("everystep_resolve_step", "nonsense", "1", "--discard")
    with pytest.raises(CommandError, match="not valid JSON"):
        call_command("everystep_resolve_step", str(run.id), "1", "--result", "{nope")
    with pytest.raises(EverystepError, match="exactly one"):
        resolve_step(run.id, "1", result=1, discard=True)

    run.refresh_from_db()
    assert run.status == Workflow.Status.BLOCKED
    assert run.steps.get(step_id="1").status == Step.Status.STARTED


def test_the_fault_hook_sees_the_context_the_step_id_and_the_steps_name():
    seen = []

    def fault(ctx, step_id, name):
        seen.append((ctx.workflow_name, step_id, name.rsplit(".", 1)[-1], sorted(ctx.outcomes)))

    runner.fault = fault
    attempt_run = schedule(workflows.add_twice, 1, 2)
    attempt()
    assert seen == [
        (attempt_run.name, "1", "add", []),
        (attempt_run.name, "2", "add", ["1"]),
    ]
