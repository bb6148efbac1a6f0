"""Code that changes under runs in flight (§16): `patched(name)` lets new
code branch while runs that went past the point replay the old path, and a
change without it fails the run with a `WorkflowCodeError` that says so."""

import pytest

from everystep import patched, schedule
from everystep.errors import EverystepError
from everystep.models import Step, Workflow
from tests import patch_workflows
from tests.helpers import attempt, recorded_steps

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _old_code():
    patch_workflows.CALLS.clear()
    patch_workflows.roll_back()
    yield
    patch_workflows.roll_back()


def row(run):
    return Workflow.objects.get(id=run.id)


def test_a_run_that_went_past_the_patch_on_old_code_replays_the_old_path(moved_clock):
    old = schedule(patch_workflows.checkout, "A")
    assert attempt() == "scheduled"  # shipped, then sleeps a day
    patch_workflows.deploy_the_fee()
    new = schedule(patch_workflows.checkout, "B")
    assert attempt() == "scheduled"  # the new run takes the fee, ships, sleeps
    moved_clock.advance(86_401)
    for _ in range(2):
        assert attempt() == "completed"
    assert row(old).result == [None, "shipped A"]  # no fee, shipped once
    assert row(new).result == ["fee for B", "shipped B"]
    assert patch_workflows.CALLS == [("ship", "A"), ("fee", "B"), ("ship", "B")]
    assert "patched:fee" not in recorded_steps(row(old))
    assert recorded_steps(row(new))["patched:fee"] == ("patched", "done", True)
    # The marker moved no position: the new run's fee is step 1.
    assert recorded_steps(row(new))["1"][0] == "charge_fee"


def test_a_run_that_had_not_reached_the_patch_takes_the_new_path(moved_clock):
    run = schedule(patch_workflows.checkout, "C")
    patch_workflows.deploy_the_fee()
    assert attempt() == "scheduled"
    moved_clock.advance(86_401)
    assert attempt() == "completed"
    assert row(run).result == ["fee for C", "shipped C"]


def test_a_run_on_the_new_code_replays_its_patch_after_a_crash(moved_clock):
    from everystep import testing

    patch_workflows.deploy_the_fee()
    run = schedule(patch_workflows.checkout, "D")
    with testing.crash_after("ship"):
        assert attempt() == "running"
    assert attempt(parked=True) == "scheduled"
    moved_clock.advance(86_401)
    assert attempt() == "completed"
    assert row(run).result == ["fee for D", "shipped D"]
    assert patch_workflows.CALLS.count(("fee", "D")) == 1
    assert Step.objects.filter(workflow_id=run.id, name="everystep.patched").count() == 1


def test_a_change_without_a_patch_fails_the_run_and_points_to_patched(moved_clock):
    old = schedule(patch_workflows.checkout, "E")
    assert attempt() == "scheduled"

    def reordered(order):
        from tests.patch_workflows import charge_fee

        return [charge_fee(order)]

    from everystep.core import registry

    registry.register(reordered, name=patch_workflows.checkout.__everystep_workflow__)
    moved_clock.advance(86_401)
    assert attempt() == "failed"
    error = row(old).error
    assert error["type"] == "everystep.errors.WorkflowCodeError"
    assert "recorded step 1 as tests.patch_workflows.ship" in error["message"]
    assert "now calls tests.patch_workflows.charge_fee there" in error["message"]
    assert "everystep.patched(" in error["message"]


def test_outside_a_workflow_patched_is_true_and_a_bad_name_is_refused():
    assert patched("fee") is True
    with pytest.raises(EverystepError, match="a patch name must be 1 to 200 letters"):
        patched("not a name")
