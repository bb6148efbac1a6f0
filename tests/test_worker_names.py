"""One live worker per name (§7), and the embedded worker's lifecycle."""

import signal
import sys

import pytest

from everystep import schedule
from everystep.models import Step, Workflow
from tests import workflows
from tests.helpers import opened, started, wait_until
from tests.workerproc import manage_py_environment, stop_embedded, timed_wait

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_second_worker_under_a_live_name_waits_its_drain_time_then_exits_2(spawn_worker):
    first = spawn_worker("twin").wait_ready()
    second = spawn_worker("twin", "--drain", "2")
    second.wait_for_log("held by a live worker")
    code, seconds = timed_wait(second, 30)
    assert code == 2
    assert seconds >= 1.5, "it should wait for the name before giving up"
    assert "'twin'" in second.log().strip().splitlines()[-1]
    assert "ready" not in second.log()
    assert first.alive()
    first.send(signal.SIGTERM)
    assert first.wait() == 0


def test_a_worker_started_during_its_predecessors_drain_takes_the_name_when_it_exits(
    spawn_worker, tmp_path
):
    run = schedule(workflows.gated, str(tmp_path))
    old = spawn_worker("rolling", "--drain", "60").wait_ready()
    started(tmp_path, "first")
    old.send(signal.SIGTERM)
    old.wait_for_log("draining")

    new = spawn_worker("rolling", "--drain", "60")
    new.wait_for_log("held by a live worker")
    opened(tmp_path, "first")
    opened(tmp_path, "second")
    assert old.wait() == 0
    new.wait_ready()
    wait_until(lambda: Workflow.objects.get(id=run.id).status == Workflow.Status.COMPLETED)
    new.send(signal.SIGTERM)
    assert new.wait() == 0


def test_after_a_stop_the_name_is_free_again_in_the_same_process(embedded_worker):
    first = embedded_worker(name="reused")
    run = schedule(workflows.quick, 1)
    wait_until(lambda: Workflow.objects.get(id=run.id).status == Workflow.Status.COMPLETED)
    stop_embedded(first)
    second = embedded_worker(name="reused", drain=1)
    again = schedule(workflows.quick, 2)
    wait_until(lambda: Workflow.objects.get(id=again.id).status == Workflow.Status.COMPLETED)
    stop_embedded(second)


def test_an_embedded_worker_stops_with_stop_and_leaves_nothing_claimed(embedded_worker, tmp_path):
    runs = [schedule(workflows.gated, str(tmp_path / str(n))) for n in range(3)]
    for n in range(3):
        (tmp_path / str(n)).mkdir()
    worker = embedded_worker(name="embedded", pool_size=2, drain=30)
    wait_until(lambda: all((tmp_path / str(n) / "first.started").exists() for n in range(2)))
    worker.stop()
    for n in range(3):
        opened(tmp_path / str(n), "first")
    worker.thread.join(30)
    assert not worker.thread.is_alive() and not worker.abandoned
    assert not any((tmp_path / str(n) / "second.started").exists() for n in range(3))
    assert not Workflow.objects.filter(status="running").exists()
    assert (
        sorted(
            Workflow.objects.filter(id__in=[r.id for r in runs]).values_list("status", flat=True)
        )
        == ["scheduled"] * 3
    )


def test_once_stop_returns_no_new_step_starts_though_the_loop_has_not_turned(
    embedded_worker, tmp_path
):
    run = schedule(workflows.gated, str(tmp_path))
    worker = embedded_worker(name="stopping", pool_size=1, drain=30)
    started(tmp_path, "first")
    worker.stop()
    # Read before the worker's loop has had a turn to see the request.
    assert worker.health() == (True, False, "draining")
    opened(tmp_path, "first")
    worker.thread.join(30)
    assert not worker.thread.is_alive() and not worker.abandoned
    assert not (tmp_path / "second.started").exists()
    assert Workflow.objects.get(id=run.id).status == Workflow.Status.SCHEDULED
    # The step that ended after the stop is recorded; the next one never started.
    assert list(Step.objects.filter(workflow_id=run.id).values_list("status", flat=True)) == [
        Step.Status.DONE
    ]


@pytest.mark.backends("postgres")
def test_on_postgresql_an_idle_worker_is_woken_by_a_schedule_long_before_its_next_poll(
    spawn_worker,
):
    worker = spawn_worker("listener", "--poll", "120").wait_ready()
    assert "woken by LISTEN/NOTIFY" in worker.log()
    run = schedule(workflows.quick, 1)
    wait_until(lambda: Workflow.objects.get(id=run.id).status == "completed", timeout=60)
    worker.send(signal.SIGTERM)
    assert worker.wait() == 0


def test_without_notify_the_worker_polls(spawn_worker):
    worker = spawn_worker("poller", "--poll", "0.05", "--no-notify").wait_ready()
    assert "polling" in worker.log()
    run = schedule(workflows.quick, 1)
    wait_until(lambda: Workflow.objects.get(id=run.id).status == "completed")
    worker.send(signal.SIGTERM)
    assert worker.wait() == 0


def worker_on_host(spawn_process, hostname, env=None):
    """A ``manage.py everystep_worker`` on the host name `hostname`, set in
    a UTS namespace of its own as a container runtime sets it; ready."""
    command = [
        "unshare",
        "--uts",
        "--",
        "sh",
        "-c",
        'hostname "$1" && exec "$2" -m django everystep_worker',
        "sh",
        hostname,
        sys.executable,
    ]
    return spawn_process("host", command, env=manage_py_environment(env)).wait_ready()


@pytest.mark.parametrize(
    "hostname, noted",
    [
        ("3f2a9c1b7d4e", True),  # Docker's and Podman's default: the container id
        ("orders-worker-7d9c8b6f5-x2k4p", True),  # a Kubernetes Deployment's pod
        ("orders-worker-0", False),  # a StatefulSet's pod: stable
        ("db-replica-east2", False),  # two dashed words: not Kubernetes' alphabet
        ("db-host-1", False),
    ],
)
def test_a_worker_named_after_a_random_host_name_says_so_at_start(spawn_process, hostname, noted):
    """Not a warning any more: its runs are recovered by other workers if it
    dies (SPEC §16); a stable name only resumes them sooner."""
    worker = worker_on_host(spawn_process, hostname)
    assert f"worker {hostname} ready" in worker.log()
    said = [line for line in worker.log().splitlines() if "looks random" in line]
    assert bool(said) == noted, worker.log()
    assert all(line.startswith("INFO ") and "orphan timeout" in line for line in said), said
    worker.send(signal.SIGTERM)
    assert worker.wait() == 0


def test_a_worker_given_its_name_does_not_warn_whatever_the_host_name(spawn_process):
    worker = worker_on_host(spawn_process, "3f2a9c1b7d4e", {"EVERYSTEP_NAME": "orders-1"})
    assert "worker orders-1 ready" in worker.log() and "looks random" not in worker.log()
    worker.send(signal.SIGTERM)
    assert worker.wait() == 0


def test_a_random_host_name_is_still_a_warning_when_no_worker_recovers_orphans(spawn_process):
    worker = worker_on_host(spawn_process, "3f2a9c1b7d4e", {"EVERYSTEP_ORPHAN_TIMEOUT": "0"})
    said = [line for line in worker.log().splitlines() if "looks random" in line]
    assert len(said) == 1 and said[0].startswith("WARNING "), worker.log()
    assert "EVERYSTEP_ORPHAN_TIMEOUT is 0" in said[0]
    worker.send(signal.SIGTERM)
    assert worker.wait() == 0
