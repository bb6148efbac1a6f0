"""Time and control under SIGKILL (§13, with §7 and §10): a worker killed
while a run sleeps, while a step waits for its retry, or between a cancel
request and the next step loses nothing and repeats no step.

Real worker processes (``manage.py everystep_worker``) run the test
workflows; their steps count their calls in files, which survive the kill.
"""

import signal

import pytest

from everystep import cancel, schedule
from everystep.models import Step, Workflow
from tests import workflows
from tests.helpers import opened, started, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def passes(gates, label):
    path = gates / f"{label}.passed"
    return len(path.read_text()) if path.exists() else 0


def status_of(run):
    return Workflow.objects.get(id=run.id).status


def killed_while_off_its_worker(spawn_worker, run, waiting_step, what):
    """SIGKILL the worker that ran `run` once `waiting_step` (a queryset)
    is recorded and the run is back to ``scheduled`` (`what` says so);
    return a second worker, ready, once it has completed the run."""
    first = spawn_worker("first").wait_ready()
    wait_until(
        lambda: waiting_step.exists() and status_of(run) == "scheduled",
        message=what,
    )
    first.send(signal.SIGKILL)
    first.wait()
    second = spawn_worker("second").wait_ready()
    wait_until(lambda: status_of(run) == "completed", message="the run to resume and complete")
    return second


def test_a_worker_killed_while_its_run_sleeps_loses_nothing(spawn_worker, tmp_path):
    for label in ("before", "after"):
        opened(tmp_path, label)
    run = schedule(workflows.gated_sleeper, str(tmp_path), 2.0)
    second = killed_while_off_its_worker(
        spawn_worker,
        run,
        Step.objects.filter(workflow_id=run.id, name="everystep.sleep"),
        "the run to record its sleep and leave the worker",
    )
    assert (passes(tmp_path, "before"), passes(tmp_path, "after")) == (1, 1)
    wake_at = Step.objects.get(workflow_id=run.id, name="everystep.sleep").result
    assert Workflow.objects.get(id=run.id).completed_at >= wake_at
    second.send(signal.SIGTERM)
    assert second.wait() == 0


def test_a_worker_killed_while_a_step_waits_for_its_retry_loses_nothing(spawn_worker, tmp_path):
    run = schedule(workflows.retried_across_workers, str(tmp_path))
    second = killed_while_off_its_worker(
        spawn_worker,
        run,
        Step.objects.filter(workflow_id=run.id, status="retrying"),
        "the step to wait for its retry, the run off the worker",
    )
    assert (tmp_path / "calls").read_text() == "xx"
    step = Step.objects.get(workflow_id=run.id)
    assert (step.status, step.attempts, step.result) == ("done", 2, 2)
    second.send(signal.SIGTERM)
    assert second.wait() == 0


def test_a_running_run_is_cancelled_at_its_next_step_by_a_live_worker(spawn_worker, tmp_path):
    run = schedule(workflows.gated, str(tmp_path))
    worker = spawn_worker("cancels").wait_ready()
    started(tmp_path, "first")
    assert cancel(run.id, reason="enough") == "running"
    opened(tmp_path, "first")
    wait_until(lambda: status_of(run) == "cancelled", message="the run to be cancelled")
    assert passes(tmp_path, "first") == 1
    assert not (tmp_path / "second.started").exists()
    assert Step.objects.get(workflow_id=run.id, step_id="1").status == "done"
    assert Workflow.objects.get(id=run.id).error["message"] == "enough"
    worker.send(signal.SIGTERM)
    assert worker.wait() == 0


def test_a_cancel_asked_of_a_run_whose_worker_is_killed_ends_it_on_the_take_back(
    spawn_worker, tmp_path
):
    """Killed mid-step after the request: the worker that starts under the
    same name takes the run back and cancels it without running a step."""
    run = schedule(workflows.gated, str(tmp_path))
    doomed = spawn_worker("cancel-doomed").wait_ready()
    started(tmp_path, "first")
    cancel(run.id)
    doomed.send(signal.SIGKILL)
    doomed.wait()
    opened(tmp_path, "first")
    opened(tmp_path, "second")

    again = spawn_worker("cancel-doomed").wait_ready()
    wait_until(lambda: status_of(run) == "cancelled", message="the take-back to cancel the run")
    assert len((tmp_path / "first.started").read_text()) == 1  # not called again
    assert not (tmp_path / "second.started").exists()
    assert not Step.objects.filter(workflow_id=run.id).exists()
    again.send(signal.SIGTERM)
    assert again.wait() == 0
