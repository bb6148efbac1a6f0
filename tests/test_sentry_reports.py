"""Sentry reports through the real sentry-sdk transport, end to end: a run
that ends ``failed`` arrives once at a fake Sentry server with the run's
context and tags; stopped, completed and drained runs never arrive."""

import signal

import pytest
import sentry_sdk

from everystep import schedule
from tests import workflows
from tests.fakesentry import describe, fake_sentry  # noqa: F401
from tests.helpers import opened, statuses, wait_until
from tests.workerproc import stop_embedded
from tests.zipapp import workflow_environment

pytestmark = pytest.mark.django_db(transaction=True)

FAILING = "tests.workflows.failing_body"


@pytest.fixture
def pyz_worker(pyz, spawn_process, tmp_path):
    """Start ``everystep.pyz worker`` from a directory outside the repository,
    reporting to `dsn`, under the name `name`."""

    def spawn(name, dsn, *args):
        env = workflow_environment(SENTRY_DSN=dsn, EVERYSTEP_NAME=name)
        command = [str(pyz), "worker", *args]
        return spawn_process(name, command, env=env, cwd=tmp_path).wait_ready()

    return spawn


@pytest.fixture
def sentry_in_process(fake_sentry):  # noqa: F811
    """The real sentry-sdk initialized in this process, sending to the fake;
    closed and switched off at the end, before the fake closes."""
    sentry_sdk.init(dsn=fake_sentry.dsn)
    yield
    client = sentry_sdk.get_client()
    client.close()
    sentry_sdk.init(dsn=None)


def stop(worker):
    """SIGTERM the worker and wait for its clean exit: by then sentry-sdk's
    exit hook has flushed whatever it still held."""
    worker.send(signal.SIGTERM)
    assert worker.wait(60) == 0, worker.log()


def reach(run_ids, expected, timeout=60.0):
    wait_until(
        lambda: statuses(run_ids) == expected, timeout, message=f"runs {run_ids} to be {expected}"
    )


def gate_started(directory, label):
    wait_until(
        lambda: (directory / f"{label}.started").exists(),
        60.0,
        message=f"gate {label} reached in {directory}",
    )


def reported_runs(events):
    return [event.get("contexts", {}).get("everystep", {}).get("workflow_id") for event in events]


def assert_failing_body_report(event, run, worker_name):
    """`event` is the report of `run`, a `failing_body` run that failed on `worker_name`."""
    exception = event["exception"]["values"][-1]
    assert (exception["type"], exception["value"]) == ("CustomError", "the body itself failed")
    assert exception.get("module") == "tests.workflows"
    frames = exception.get("stacktrace", {}).get("frames", [])
    assert "failing_body" in [frame.get("function") for frame in frames], frames
    assert event["contexts"]["everystep"] == {
        "workflow": FAILING,
        "workflow_id": str(run.id),
        "worker": worker_name,
    }
    tags = event.get("tags", {})
    assert tags.get("everystep.workflow") == FAILING, tags
    assert tags.get("everystep.worker") == worker_name, tags
    assert event.get("level") == "error"


def test_a_failed_run_of_a_zipapp_worker_is_reported_once_with_its_context(
    pyz_worker,
    fake_sentry,  # noqa: F811
):
    worker = pyz_worker("reporter", fake_sentry.dsn)
    run = schedule(workflows.failing_body)
    reach([run.id], {"failed": 1})
    event = fake_sentry.wait_for_events(1)[0]
    stop(worker)

    events = fake_sentry.events
    assert len(events) == 1, [describe(e) for e in events]
    assert_failing_body_report(event, run, "reporter")
    assert fake_sentry.rejected == []
    # A frame's locals hold a run's arguments and its steps' results: none is sent.
    frames = event["exception"]["values"][-1]["stacktrace"]["frames"]
    assert [frame for frame in frames if "vars" in frame] == []


def test_stopped_completed_and_drained_runs_of_a_zipapp_worker_are_not_reported(
    pyz_worker,
    fake_sentry,  # noqa: F811
    tmp_path,
):
    boundary, deadline = tmp_path / "boundary", tmp_path / "deadline"
    boundary.mkdir()
    deadline.mkdir()
    worker = pyz_worker("quiet", fake_sentry.dsn, "--pool", "4", "--drain", "5")
    stopped = schedule(workflows.stop_in_body)
    completed = schedule(workflows.quick, 1)
    requeued_at_boundary = schedule(workflows.gated, str(boundary))
    requeued_at_deadline = schedule(workflows.gated, str(deadline))
    reach([stopped.id], {"stopped": 1})
    reach([completed.id], {"completed": 1})
    gate_started(boundary, "first")
    gate_started(deadline, "first")

    # Scheduled last: once its report arrived, any report of the runs
    # before it, sent by the same transport queue, would have too.
    failed = schedule(workflows.failing_body)
    reach([failed.id], {"failed": 1})
    fake_sentry.wait_for_events(1)

    worker.send(signal.SIGTERM)
    worker.wait_for_log("draining")
    opened(boundary, "first")  # its next step boundary requeues it; the other waits
    assert worker.wait(60) == 0, worker.log()

    drained = [requeued_at_boundary, requeued_at_deadline]
    assert statuses([r.id for r in drained]) == {"scheduled": 2}
    assert [s.step_id for s in requeued_at_boundary.steps.all()] == ["1"]
    assert not requeued_at_deadline.steps.exists()
    log = worker.log()
    assert f"run {requeued_at_boundary.id} requeued at a step boundary" in log, log
    assert f"run {requeued_at_deadline.id} requeued at the drain deadline" in log, log
    assert statuses([stopped.id, completed.id, failed.id]) == {
        "stopped": 1,
        "completed": 1,
        "failed": 1,
    }

    events = fake_sentry.events
    assert reported_runs(events) == [str(failed.id)], [describe(e) for e in events]
    assert_failing_body_report(events[0], failed, "quiet")
    assert fake_sentry.rejected == []


def test_a_failed_run_of_an_embedded_worker_is_reported_by_the_sdk_of_the_process(
    sentry_in_process,
    fake_sentry,  # noqa: F811
    embedded_worker,
):
    worker = embedded_worker(name="embedded", pool_size=2)
    completed = schedule(workflows.quick, 1)
    run = schedule(workflows.failing_body)
    reach([completed.id, run.id], {"completed": 1, "failed": 1})
    event = fake_sentry.wait_for_events(1)[0]
    stop_embedded(worker)
    sentry_sdk.flush(timeout=10)

    events = fake_sentry.events
    assert len(events) == 1, [describe(e) for e in events]
    assert_failing_body_report(event, run, "embedded")
    assert fake_sentry.rejected == []
