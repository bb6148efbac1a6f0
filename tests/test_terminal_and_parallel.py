"""How runs end: Terminal stops them; parallel records every branch."""

import pytest

from everystep.core import serde
from everystep.errors import Terminal
from everystep.models import Workflow
from tests import workflows
from tests.helpers import recorded_steps, run_to_end

pytestmark = pytest.mark.django_db(transaction=True)


def test_terminal_from_the_body_stops_the_run():
    run = run_to_end(workflows.stop_in_body)
    assert run.status == Workflow.Status.STOPPED
    error = serde.decode_exception(run.error)
    assert isinstance(error, Terminal)
    assert (error.reason, error.payload) == ("not today", {"retry": False})
    assert run.completed_at is not None


def test_terminal_from_a_branch_stops_the_run_after_recording_healthy_siblings(calls):
    run = run_to_end(workflows.stop_in_branch)
    assert run.status == Workflow.Status.STOPPED
    assert run.error["message"] == "branch says stop"
    assert recorded_steps(run) == {
        "1.0.1": ("echo", "done", "healthy"),
        "1.1.1": ("stop_here", "failed", None),
    }
    assert calls["echo"] == 1  # the body stopped at the fork


def test_one_failing_branch_is_raised_as_is_and_the_healthy_one_is_recorded():
    run = run_to_end(workflows.one_branch_fails)
    assert run.status == Workflow.Status.FAILED
    assert run.error["type"] == "tests.workflows.CustomError"
    assert run.error["message"] == "one"
    assert recorded_steps(run)["1.0.1"] == ("echo", "done", "healthy")


def test_several_failing_branches_are_raised_as_an_exception_group():
    run = run_to_end(workflows.two_branches_fail)
    assert run.status == Workflow.Status.FAILED
    assert run.error["type"] == "builtins.ExceptionGroup"
    assert "several parallel branches failed" in run.error["message"]
    assert recorded_steps(run) == {
        "1.0.1": ("fail", "failed", None),
        "1.1.1": ("echo", "done", "healthy"),
        "1.2.1": ("fail", "failed", None),
    }


def test_outside_a_workflow_parallel_raises_the_same_way():
    with pytest.raises(ExceptionGroup) as group:
        workflows.parallel(lambda: workflows.fail("a"), lambda: workflows.fail("b"))
    assert [str(e) for e in group.value.exceptions] == ["a", "b"]
    with pytest.raises(Terminal):
        workflows.parallel(lambda: workflows.fail("a"), lambda: workflows.stop_here("now"))
