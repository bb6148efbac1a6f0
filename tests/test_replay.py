"""Replay (§3): recorded steps are served, not re-run; failures come back."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from everystep import schedule, step, workflow
from everystep.db import claims, runs
from everystep.engine import runner
from everystep.errors import StepFailure
from everystep.models import Step, Workflow
from tests import workflows
from tests.helpers import WORKER, attempt, claim_one, crash_at, recorded_steps, run_to_end

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_resumed_run_serves_recorded_results_without_calling_the_step(calls):
    runner.fault = crash_at("2")
    run = schedule(workflows.add_twice, 1, 2)
    assert attempt() == Workflow.Status.RUNNING  # died after step 2 ran, before its record
    assert calls["add"] == 2
    assert set(recorded_steps(run)) == {"1"}

    runner.fault = None
    assert attempt(parked=True) == Workflow.Status.COMPLETED
    run.refresh_from_db()
    assert run.result == 5
    assert calls["add"] == 3  # step 1 served from the record, step 2 executed again
    assert recorded_steps(run) == {"1": ("add", "done", 3), "2": ("add", "done", 5)}


def test_a_recorded_failure_is_reraised_with_its_original_type(calls):
    runner.fault = crash_at("2")
    run = schedule(workflows.with_cleanup)
    attempt()
    assert recorded_steps(run) == {"1": ("fail", "failed", None)}

    runner.fault = None
    attempt(parked=True)
    run.refresh_from_db()
    assert run.status == Workflow.Status.COMPLETED
    assert run.result == "recovered"
    # The failing step was not called again: its CustomError came from the
    # record and the body's except clause ran the cleanup step durably.
    assert calls["fail"] == 1
    assert calls["echo"] == 2
    assert recorded_steps(run)["2"] == ("echo", "done", "cleaned up after boom")


def test_a_recorded_failure_whose_class_cannot_be_rebuilt_comes_back_as_step_failure():
    runner.fault = crash_at("never")  # keep the hook set; nothing crashes
    run = schedule(workflows.unbuildable_failure)
    attempt()
    run.refresh_from_db()
    assert run.result == ["UnbuildableError", "7: out of order"]

    # Replay the same recorded failure: the class needs two args, the record has one message.
    Workflow.objects.filter(id=run.id).update(status="scheduled", claimed_by=None)
    attempt()
    run.refresh_from_db()
    assert run.result == ["StepFailure", "tests.workflows.UnbuildableError: 7: out of order"]


def test_an_exception_class_that_is_gone_replays_as_step_failure():
    run = schedule(workflows.with_cleanup)
    attempt()
    Step.objects.filter(workflow=run, step_id="1").update(
        error={"type": "gone.module.VanishedError", "message": "boom", "args": ["boom"]}
    )

    @workflow
    def reads_failure():
        try:
            workflows.fail("boom")
        except StepFailure as exc:
            return [exc.type_name, exc.message]

    Workflow.objects.filter(id=run.id).update(
        status="scheduled", claimed_by=None, name=reads_failure.__everystep_workflow__
    )
    attempt()
    run.refresh_from_db()
    assert run.result == ["gone.module.VanishedError", "boom"]


def test_the_body_failing_fails_the_run_with_its_encoded_exception():
    from everystep.core import serde

    run = run_to_end(workflows.failing_body)
    assert run.status == Workflow.Status.FAILED
    assert run.error["type"] == "tests.workflows.CustomError"
    error = serde.decode_exception(run.error)
    assert isinstance(error, workflows.CustomError)
    assert str(error) == "the body itself failed"
    assert recorded_steps(run) == {"1": ("echo", "done", "first")}


def test_changed_code_at_a_recorded_id_fails_the_run_with_workflow_code_error(calls):
    run = schedule(workflows.add_twice, 1, 2)
    runner.fault = crash_at("2")
    attempt()

    @workflow
    def add_twice(a, b):  # the "new version": an echo where add was recorded
        return workflows.echo(a)

    Workflow.objects.filter(id=run.id).update(name=add_twice.__everystep_workflow__)
    runner.fault = None
    attempt(parked=True)
    run.refresh_from_db()
    assert run.status == Workflow.Status.FAILED
    assert run.error["type"] == "everystep.errors.WorkflowCodeError"
    assert "tests.workflows.add" in run.error["message"]
    assert calls["echo"] == 0


def test_a_run_of_a_workflow_this_process_does_not_have_waits_for_one_that_has_it():
    run = schedule(workflows.add_twice, 1, 2)
    Workflow.objects.filter(id=run.id).update(name="newer.module.workflow")
    assert claims.claim(WORKER, 8) == []
    assert len(claims.claim(WORKER, 8, ["newer.module.workflow"])) == 1
    run.refresh_from_db()
    assert (run.status, run.claimed_by) == (Workflow.Status.RUNNING, WORKER)


def test_a_parked_run_of_a_workflow_this_process_does_not_have_is_released_not_failed():
    run = schedule(workflows.add_twice, 1, 2)
    Workflow.objects.filter(id=run.id).update(name="older.module.workflow")
    (parked,) = claims.claim(WORKER, 1, ["older.module.workflow"])
    assert runner.execute(parked) == Workflow.Status.SCHEDULED
    run.refresh_from_db()
    assert (run.status, run.claimed_by, run.error) == (Workflow.Status.SCHEDULED, None, None)


def first_attempt_loads():
    """Queries a first attempt spends loading steps: none where the claim
    tells that there are none (PostgreSQL, SQLite), one on MariaDB."""
    return 1 if connection.vendor == "mysql" else 0


def test_round_trips_one_per_step_and_one_to_finish():
    run = schedule(workflows.echo_values, *range(10))
    claimed = claim_one()
    with CaptureQueriesContext(connection) as queries:
        assert runner.execute(claimed) == Workflow.Status.COMPLETED
    assert len(queries) == first_attempt_loads() + 10 + 1, [q["sql"][:80] for q in queries]
    assert run.steps.count() == 10


def test_a_requeued_run_loads_its_recorded_steps_in_one_query(calls):
    run = schedule(workflows.echo_values, *range(10))
    runner.fault = crash_at("3")
    try:
        assert attempt() == Workflow.Status.RUNNING
    finally:
        runner.fault = None
    assert runs.requeue_runs(claimed_by=WORKER) == [run.id]
    claimed = claim_one()
    assert claimed.has_steps is not False
    with CaptureQueriesContext(connection) as queries:
        assert runner.execute(claimed) == Workflow.Status.COMPLETED
    assert len(queries) == 1 + 8 + 1, [q["sql"][:80] for q in queries]  # load, steps 3-10, finish
    assert calls["echo"] == 11  # step 3 ran again: its record never landed
    assert run.steps.count() == 10


def test_an_unsafe_step_costs_two_round_trips():
    schedule(workflows.pay, 5)
    claimed = claim_one()
    with CaptureQueriesContext(connection) as queries:
        runner.execute(claimed)
    # charge (started + outcome), echo, finish
    assert len(queries) == first_attempt_loads() + 2 + 1 + 1


def test_a_step_result_that_cannot_be_serialized_records_nothing_and_fails_the_run(calls):
    run = run_to_end(workflows.calls_unserializable_step)
    assert run.status == Workflow.Status.FAILED
    assert run.error["type"] == "everystep.errors.EverystepError"
    assert "builtins.object" in run.error["message"]
    assert calls["not_serializable"] == 1  # the function ran: the check is after it
    assert not run.steps.exists()


def test_step_arguments_are_validated_before_the_call(calls):
    @workflow
    def bad_argument():
        workflows.echo({1, 2})

    run = run_to_end(bad_argument)
    assert run.status == Workflow.Status.FAILED
    assert "builtins.set" in run.error["message"]
    assert calls["echo"] == 0


def test_a_step_called_with_keyword_arguments_records_them():
    @step
    def greet(name, *, greeting):
        return f"{greeting}, {name}"

    @workflow
    def greets():
        return greet("Ada", greeting="Hello")

    run = run_to_end(greets)
    assert run.result == "Hello, Ada"
    recorded = run.steps.get()
    assert recorded.args == ["Ada"]
    assert recorded.kwargs == {"greeting": "Hello"}
