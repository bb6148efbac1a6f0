"""A step's function is outside the workflow's recording, and steps never
run inside the body's own transaction (§10)."""

import pytest

from everystep import schedule
from everystep.core import serde
from everystep.engine import runner
from everystep.errors import EverystepError
from everystep.models import Workflow
from tests import workflows
from tests.helpers import attempt, crash_at, recorded_steps, run_to_end

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_step_called_from_a_step_is_a_plain_call_and_moves_no_step_id(calls):
    run = run_to_end(workflows.step_calls_step)
    assert run.result == ["outer:inner:from-outer", "inner:from-body"]
    assert recorded_steps(run) == {
        "1": ("outer", "done", "outer:inner:from-outer"),
        "2": ("inner", "done", "inner:from-body"),
    }


def test_a_step_that_calls_a_step_replays_the_same_results_after_a_crash(calls):
    runner.fault = crash_at("2")
    run = schedule(workflows.step_calls_step)
    assert attempt() == Workflow.Status.RUNNING
    runner.fault = None
    assert attempt(parked=True) == Workflow.Status.COMPLETED
    run.refresh_from_db()
    assert run.result == ["outer:inner:from-outer", "inner:from-body"]
    assert calls["outer"] == 1  # served from the record on resume


def test_inside_a_step_the_context_is_the_runs_and_a_fork_is_plain(calls):
    run = run_to_end(workflows.step_forks_inside)
    run_id = str(run.id)
    assert run.result == [[run_id, "inner:x", run_id], "after"]
    assert set(recorded_steps(run)) == {"1", "2"}


def refused(run, calls):
    error = serde.decode_exception(run.error)
    assert run.status == Workflow.Status.FAILED
    assert isinstance(error, EverystepError)
    assert "transaction.atomic()" in str(error) and "into the step" in str(error)
    assert not run.steps.exists()


def test_an_unsafe_step_inside_the_bodys_atomic_block_is_refused_before_it_runs(calls):
    run = run_to_end(workflows.charges_inside_atomic, 30)
    refused(run, calls)
    assert calls["charge"] == 0


def test_an_unsafe_step_after_the_body_turned_autocommit_off_is_refused_and_never_runs_twice(
    calls,
):
    """Its started record would ride the body's open transaction: a crash
    right after the charge rolls both back, and the resumed run charges
    again. It is refused before it runs, and the run fails saying why."""
    from django.db import connection

    runner.fault = crash_at("1")
    run = schedule(workflows.charges_with_autocommit_off, 30)
    status = attempt()
    runner.fault = None
    connection.close()  # what the process's death does to its open transaction
    if status == Workflow.Status.RUNNING:
        attempt(parked=True)
    run.refresh_from_db()
    assert calls["charge"] == 0
    assert run.status == Workflow.Status.FAILED
    error = serde.decode_exception(run.error)
    assert isinstance(error, EverystepError)
    assert "autocommit" in str(error) and "set_autocommit(True)" in str(error)


def test_a_step_that_leaves_autocommit_off_fails_the_run_before_the_next_step_runs(calls):
    """The step's own writes are in a transaction nothing will commit, and
    the records after it would ride it: the run fails, naming the step."""
    run = run_to_end(workflows.step_leaves_autocommit_off, 30)
    assert run.status == Workflow.Status.FAILED
    assert calls["charge"] == 0
    assert "left autocommit off" in run.error["message"]
    assert not run.steps.filter(status="done").exists()


def test_a_fork_inside_the_bodys_atomic_block_is_refused_before_it_runs(calls):
    run = run_to_end(workflows.forks_inside_atomic)
    refused(run, calls)
    assert calls["echo"] == 0
