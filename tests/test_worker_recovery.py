"""Crash recovery: a SIGKILLed worker's runs wait for its name; a stale
runner's late writes never land; engine errors fail a run, not the worker."""

import signal

import pytest

from everystep import schedule
from everystep.db import steps
from everystep.engine import runner
from everystep.models import Workflow
from tests import workflows
from tests.helpers import crash_at, opened, sentry_events, started, wait_until
from tests.workerproc import stop_embedded

pytestmark = pytest.mark.django_db(transaction=True)


def status_of(run):
    return Workflow.objects.values_list("status", "claimed_by").get(id=run.id)


def completes(run):
    wait_until(
        lambda: status_of(run)[0] == Workflow.Status.COMPLETED, message=f"run {run.id} completed"
    )


def test_sigkill_mid_step_parks_the_run_until_a_worker_with_the_same_name_returns(
    spawn_worker, tmp_path
):
    run = schedule(workflows.gated, str(tmp_path))
    doomed = spawn_worker("node-a").wait_ready()
    started(tmp_path, "first")
    doomed.send(signal.SIGKILL)
    doomed.wait()
    assert status_of(run) == (Workflow.Status.RUNNING, "node-a")

    opened(tmp_path, "first")
    opened(tmp_path, "second")
    other = spawn_worker("node-b").wait_ready()
    completes(schedule(workflows.quick, 1))  # node-b is claiming...
    assert status_of(run) == (Workflow.Status.RUNNING, "node-a")  # ...but not node-a's run
    other.send(signal.SIGTERM)
    assert other.wait() == 0

    restarted = spawn_worker("node-a").wait_ready()
    completes(run)
    assert "resumed parked 1 run(s)" in restarted.log()
    run.refresh_from_db()
    assert run.result == [1, 1]  # each gate passed once...
    assert (tmp_path / "first.started").read_text() == "xx"  # ...the first entered twice
    restarted.send(signal.SIGTERM)
    assert restarted.wait() == 0


def test_no_catchup_leaves_parked_runs_alone(spawn_worker, tmp_path):
    run = schedule(workflows.gated, str(tmp_path))
    doomed = spawn_worker("node-a").wait_ready()
    started(tmp_path, "first")
    doomed.send(signal.SIGKILL)
    doomed.wait()
    debugging = spawn_worker("node-a", "--no-catchup").wait_ready()
    completes(schedule(workflows.quick, 1))
    assert status_of(run) == (Workflow.Status.RUNNING, "node-a")
    debugging.send(signal.SIGTERM)
    assert debugging.wait() == 0


def test_catchup_takes_back_more_parked_runs_than_the_pool_holds(embedded_worker):
    runner.fault = crash_at("1")
    runs = [schedule(workflows.quick, n) for n in range(5)]
    crashed = embedded_worker(name="node-c", pool_size=5)
    wait_until(
        lambda: (
            Workflow.objects.filter(status="running", claimed_by="node-c").count() == 5
            and workflows.calls["add"] == 0
            and workflows.calls["echo"] == 5
        )
    )
    stop_embedded(crashed)
    assert Workflow.objects.filter(status="running", claimed_by="node-c").count() == 5

    runner.fault = None
    embedded_worker(name="node-c", pool_size=2)
    for run in runs:
        completes(run)


def test_a_stale_runner_cannot_write_after_its_run_was_requeued_and_claimed_elsewhere(
    tmp_path, caplog, embedded_worker
):
    """Worker A's drain deadline requeues a run whose step is still running;
    worker B claims it. When A's step finally returns, neither its step
    record nor its terminal write lands; B completes the run."""
    run = schedule(workflows.gated, str(tmp_path))
    a = embedded_worker(pool_size=1, name="stale-a", drain=0.5)
    started(tmp_path, "first")
    stop_embedded(a)
    assert a.abandoned
    assert status_of(run) == (Workflow.Status.SCHEDULED, None)

    embedded_worker(pool_size=1, name="fresh-b")
    wait_until(lambda: workflows.calls["gate-first"] == 2, message="B reaching the first gate")
    opened(tmp_path, "first")  # both A's stale step and B's step return now
    opened(tmp_path, "second")
    completes(run)
    wait_until(lambda: "lost its claim" in caplog.text)

    run.refresh_from_db()
    assert run.claimed_by == "fresh-b"
    assert run.steps.count() == 2


def test_a_run_that_dies_outside_the_runner_is_failed_and_reported_while_the_worker_goes_on(
    monkeypatch, caplog, embedded_worker
):
    real_record = steps.record_step
    broken = schedule(workflows.quick, 1)

    def record_step(fence, *args, **kwargs):
        if fence.run_id == broken.id:
            raise RuntimeError("engine bug while recording")
        return real_record(fence, *args, **kwargs)

    monkeypatch.setattr(steps, "record_step", record_step)
    with sentry_events() as events:
        worker = embedded_worker(pool_size=2, name="survivor")
        wait_until(lambda: status_of(broken)[0] == Workflow.Status.FAILED)
        completes(schedule(workflows.quick, 2))
        stop_embedded(worker)

    broken.refresh_from_db()
    assert broken.error["type"] == "builtins.RuntimeError"
    assert broken.error["message"] == "engine bug while recording"
    assert "crashed outside its steps" in caplog.text
    [payload] = events
    assert payload["exception"]["values"][0]["value"] == "engine bug while recording"
    assert payload["contexts"]["everystep"]["workflow_id"] == str(broken.id)
    assert payload["contexts"]["everystep"]["workflow"] == "tests.workflows.quick"
    assert payload["tags"]["everystep.worker"] == "survivor"


def test_terminal_blocked_and_crashed_runs_are_not_reported_to_sentry(embedded_worker):
    runner.fault = crash_at("1", workflow=workflows.pay)
    blocked = schedule(workflows.pay, 3)
    stopped = schedule(workflows.stop_in_body)
    with sentry_events() as events:
        first = embedded_worker(pool_size=2, name="quiet")
        wait_until(lambda: status_of(stopped)[0] == Workflow.Status.STOPPED)
        wait_until(lambda: Workflow.objects.get(id=blocked.id).steps.exists())
        stop_embedded(first)
        runner.fault = None
        second = embedded_worker(pool_size=2, name="quiet")
        wait_until(lambda: status_of(blocked)[0] == Workflow.Status.BLOCKED)
        stop_embedded(second)
    assert events == []


def test_a_run_whose_row_vanished_is_logged_and_skipped(tmp_path, caplog, embedded_worker):
    run = schedule(workflows.gated, str(tmp_path))
    embedded_worker(pool_size=1, name="vanishing")
    started(tmp_path, "first")
    Workflow.objects.filter(id=run.id).delete()
    opened(tmp_path, "first")
    wait_until(lambda: "vanished while it ran" in caplog.text)
    completes(schedule(workflows.quick, 1))
