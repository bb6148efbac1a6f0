"""Orphans recover by themselves (SPEC §16): the runs of a worker that went
silent — SIGKILLed, SIGSTOPped — are requeued by a live worker once the
silent one's heartbeat is older than the orphan timeout and no live process
holds its name; the silent worker's late writes land on nothing; a worker
restarted under its name at once still takes its own runs back first.

Each run here is `workflows.gated`: two steps held at gates the test opens,
each step returning how many times its gate was passed, so a step executed
twice (by the silent worker and by its rescuer) shows in the gate's marks
while the run's recorded result shows which one was recorded.
"""

import os
import signal
import time
import uuid

import pytest

from everystep import schedule
from everystep.db import workers
from everystep.models import Step, Worker, Workflow
from everystep.resilience import outage
from everystep.worker import nameguard, orphans
from tests import servers, workflows
from tests.helpers import (
    lost_worker,
    opened,
    park,
    query_until_reachable,
    recorded_steps,
    started,
    wait_until,
)
from tests.test_metrics import get, metrics_worker, samples, value

pytestmark = pytest.mark.django_db(transaction=True)

TIMEOUT = 10.0  # the rescuer's --orphan-timeout, in seconds: the shortest allowed
LOOK = orphans.interval(TIMEOUT)  # the rescuer's time between two looks
# From a worker's death to its runs claimed again: the look that first reads
# its last heartbeat, the timeout, the look that finds it unchanged, and the
# claim that follows.
RECOVERED_WITHIN = TIMEOUT + 2 * LOOK + 3
# No sooner than the timeout after the last heartbeat, which is at most one
# heartbeat older than the death.
RECOVERED_AFTER = TIMEOUT - nameguard.CHECK_INTERVAL


def container_id():
    """A name like the one a container gets from its id: random, never back."""
    return uuid.uuid4().hex[:12]


def holders(runs):
    return {
        tuple(row)
        for row in Workflow.objects.filter(id__in=[run.id for run in runs]).values_list(
            "status", "claimed_by"
        )
    }


def statuses(runs):
    return {status for status, _ in holders(runs)}


def gates_for(tmp_path, count):
    directories = [tmp_path / f"run-{n}" for n in range(count)]
    for directory in directories:
        directory.mkdir()
    return directories


def complete(runs, directories):
    """Open every gate and wait for the runs to complete; their results."""
    for directory in directories:
        opened(directory, "first")
        opened(directory, "second")
    wait_until(lambda: statuses(runs) == {Workflow.Status.COMPLETED}, message="runs completed")
    return [Workflow.objects.get(id=run.id).result for run in runs]


def held_in_its_first_step(spawn_worker, tmp_path, watcher="rescuer"):
    """A gated run held at its first gate by a worker with a random name,
    and another worker watching with the orphan timeout `TIMEOUT`: (the
    gates' directory, the run, the holder's name, the holder, the watcher)."""
    [directory] = gates_for(tmp_path, 1)
    run = schedule(workflows.gated, str(directory))
    name = container_id()
    holder = spawn_worker(name).wait_ready()
    started(directory, "first")
    watching = spawn_worker(watcher, "--orphan-timeout", f"{TIMEOUT:g}").wait_ready()
    return directory, run, name, holder, watching


def test_a_sigkilled_worker_with_a_random_name_has_its_runs_completed_by_another_in_time(
    spawn_worker, tmp_path
):
    directories = gates_for(tmp_path, 2)
    runs = [schedule(workflows.gated, str(directory)) for directory in directories]
    lost = container_id()
    doomed = spawn_worker(lost, "--pool", "2").wait_ready()
    for directory in directories:
        started(directory, "first")
    rescuer = metrics_worker(spawn_worker, "rescuer", "--orphan-timeout", f"{TIMEOUT:g}")
    rescuer.wait_ready()

    doomed.send(signal.SIGKILL)
    doomed.wait()
    killed_at = time.monotonic()
    wait_until(
        lambda: holders(runs) == {(Workflow.Status.RUNNING, "rescuer")},
        timeout=RECOVERED_WITHIN + 30,
        message="the rescuer holds the dead worker's runs",
    )
    took = time.monotonic() - killed_at
    print(f"\nrecovered {took:.1f}s after the SIGKILL (timeout {TIMEOUT:g}s, look {LOOK:g}s)")
    assert RECOVERED_AFTER <= took < RECOVERED_WITHIN, rescuer.log()

    for directory in directories:
        wait_until(lambda d=directory: (d / "first.started").read_text() == "xx")
    assert complete(runs, directories) == [[1, 1], [1, 1]]
    assert holders(runs) == {(Workflow.Status.COMPLETED, "rescuer")}
    assert f"recovered 2 run(s) of worker {lost}" in rescuer.log()
    row = Worker.objects.get(name=lost)
    assert (row.recovered_by, row.recovered_runs) == ("rescuer", 2)
    assert row.recovered_at is not None
    _, text = get(rescuer.metrics_port, "/metrics")
    assert value(samples(text), "everystep_runs_recovered_total", runner="rescuer") == 2
    rescuer.send(signal.SIGTERM)
    assert rescuer.wait() == 0


def test_a_sigstopped_worker_is_recovered_and_its_late_writes_are_dropped_after_sigcont(
    spawn_worker, tmp_path
):
    """SIGSTOP: the process lives, holds its sockets (and on SQLite its file
    lock), and answers nothing. The database ends its lock's session (the
    server's idle timeout) or, on SQLite, the kernel says it is stopped; its
    run is then recovered. Continued, it finishes the step it was in and its
    write is refused: the run keeps the rescuer's steps, each once."""
    directory, run, frozen_name, frozen, rescuer = held_in_its_first_step(spawn_worker, tmp_path)

    frozen.send(signal.SIGSTOP)
    try:
        wait_until(
            lambda: holders([run]) == {(Workflow.Status.RUNNING, "rescuer")},
            timeout=90,
            message="the rescuer holds the stopped worker's run",
        )
        wait_until(lambda: (directory / "first.started").read_text() == "xx")
        opened(directory, "first")
        opened(directory, "second")
        wait_until(lambda: holders([run]) == {(Workflow.Status.COMPLETED, "rescuer")})
    finally:
        frozen.send(signal.SIGCONT)
    frozen.wait_for_log("lost its claim")
    assert (directory / "first.passed").read_text() == "xx"  # both passed the first gate...
    done = Step.Status.DONE
    assert list(recorded_steps(run).values()) == [("gate", done, 1), ("gate", done, 1)]
    assert Workflow.objects.get(id=run.id).result == [1, 1]
    assert f"recovered 1 run(s) of worker {frozen_name}" in rescuer.log()
    # The continued worker goes on under its name, and drains cleanly.
    quick = schedule(workflows.quick, 1)
    wait_until(lambda: Workflow.objects.get(id=quick.id).status == Workflow.Status.COMPLETED)
    frozen.send(signal.SIGTERM)
    assert frozen.wait() == 0, frozen.log()
    rescuer.send(signal.SIGTERM)
    assert rescuer.wait() == 0


def test_an_unsafe_step_in_flight_on_a_dead_worker_leaves_its_run_blocked(spawn_worker, tmp_path):
    run = schedule(workflows.gated_charge, str(tmp_path))
    doomed = spawn_worker(container_id()).wait_ready()
    started(tmp_path, "charge")
    rescuer = spawn_worker("rescuer", "--orphan-timeout", f"{TIMEOUT:g}").wait_ready()
    doomed.send(signal.SIGKILL)
    doomed.wait()
    wait_until(
        lambda: statuses([run]) == {Workflow.Status.BLOCKED},
        timeout=RECOVERED_WITHIN + 30,
        message="the recovered run blocked on its uncertain step",
    )
    assert (tmp_path / "charge.started").read_text() == "x"  # never called again
    assert list(recorded_steps(run).values()) == [("charge_at_gate", Step.Status.STARTED, None)]
    rescuer.send(signal.SIGTERM)
    assert rescuer.wait() == 0


def test_a_stable_name_restarted_at_once_takes_its_own_runs_back_first(spawn_worker, tmp_path):
    directories = gates_for(tmp_path, 2)
    runs = [schedule(workflows.gated, str(directory)) for directory in directories]
    node = spawn_worker("node-a", "--pool", "2").wait_ready()
    for directory in directories:
        started(directory, "first")
    # A timeout longer than the restart takes: the name comes back first.
    rescuer = spawn_worker("rescuer", "--orphan-timeout", "20").wait_ready()
    node.send(signal.SIGKILL)
    node.wait()
    restarted = spawn_worker("node-a", "--pool", "2").wait_ready()
    assert "resumed parked 2 run(s)" in restarted.log()
    assert complete(runs, directories) == [[1, 1], [1, 1]]
    assert holders(runs) == {(Workflow.Status.COMPLETED, "node-a")}
    assert "recovered" not in rescuer.log()
    assert Worker.objects.get(name="node-a").recovered_by is None
    for worker in (restarted, rescuer):
        worker.send(signal.SIGTERM)
        assert worker.wait() == 0


def test_a_live_worker_whose_heartbeat_looks_stopped_keeps_its_runs(embedded_worker, tmp_path):
    """A heartbeat can stop moving while its worker lives (its guard's thread
    held up by a slow database): the name lock it holds keeps its runs."""
    [directory] = gates_for(tmp_path, 1)
    run = schedule(workflows.gated, str(directory))
    embedded_worker(name="held-up", orphan_timeout=0)
    started(directory, "first")
    assert "held-up" in workers.holding_runs("rescuer")  # watched...
    impatient = orphans.OrphanRecovery("rescuer", 0.0, lambda: None)  # ...silent at first sight
    assert impatient.round() == 0
    assert holders([run]) == {(Workflow.Status.RUNNING, "held-up")}
    assert complete([run], [directory]) == [[1, 1]]


def test_silence_is_a_heartbeat_unchanged_for_the_timeout_as_the_watcher_reads_it():
    """Timed between the watcher's own reads: a heartbeat that moves is never
    silent, whatever its timestamps say; one that stops is, once the timeout
    has passed; and what the watcher read before an outage of its own is
    forgotten."""
    lost_worker("w-gone")  # a heartbeat timestamped long ago
    parked = park(workflows.quick, 1, worker="w-gone")
    watcher = orphans.OrphanRecovery("rescuer", 0.5, lambda: None)
    for _ in range(4):  # for longer than the timeout, its heartbeat moves: alive
        assert watcher.round() == 0
        workers.heartbeat("w-gone", Worker.State.READY, 1)
        time.sleep(0.2)
    wait_until(lambda: watcher.round() == 1, timeout=10, message="the run recovered")
    assert holders([parked]) == {(Workflow.Status.SCHEDULED, None)}

    lost_worker("w-gone-too")
    parked = park(workflows.quick, 2, worker="w-gone-too")
    assert watcher.round() == 0  # first read
    time.sleep(0.6)  # past the timeout, unchanged...
    outage.tracker.generation += 1  # ...but the watcher itself lost the database meanwhile
    assert watcher.round() == 0  # read again as if for the first time
    wait_until(lambda: watcher.round() == 1, timeout=10, message="the run recovered")


@pytest.mark.backends("postgres", "mariadb")
def test_a_requeue_is_not_committed_once_the_silent_workers_name_went_to_another(monkeypatch):
    """The rescuer's hold on the silent worker's name ends while it requeues
    (its session ended by the server), and a worker restarted under the name
    takes it: the requeue is rolled back, the runs are the restarted
    worker's."""
    from everystep.db import namelock, runs

    lost_worker("w-back")
    parked = park(workflows.quick, 1, worker="w-back")
    restarted = namelock.name_lock("w-back")
    requeue = runs.requeue_runs

    def requeue_then_lose_the_name(**kwargs):
        requeued = requeue(**kwargs)
        end_the_session_holding(restarted)
        wait_until(restarted.try_acquire, message="the name taken by the restarted worker")
        return requeued

    monkeypatch.setattr(runs, "requeue_runs", requeue_then_lose_the_name)
    try:
        assert orphans.OrphanRecovery("rescuer", 0.0, lambda: None).round() == 0
    finally:
        restarted.release()
    assert holders([parked]) == {(Workflow.Status.RUNNING, "w-back")}
    assert Worker.objects.get(name="w-back").recovered_by is None


def end_the_session_holding(lock):
    """End the database session that holds `lock`'s name, as a server ends
    an idle one."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(lock.holder_sql, [lock.key])
        holder = cursor.fetchone()[0]
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_terminate_backend(%s)", [holder])
        else:
            cursor.execute(f"KILL CONNECTION {int(holder)}")


@pytest.mark.backends("postgres", "mariadb")
def test_a_database_outage_longer_than_the_timeout_makes_no_live_worker_an_orphan(
    spawn_worker, tmp_path
):
    """Every heartbeat stops while the database is away, and a restarted
    server holds no lock: a watcher that trusted the heartbeats' age would
    take the runs of a worker that is only reconnecting. Silence counts from
    the watcher's own reads, which start again after the outage."""
    server = servers.running_server(os.environ["EVERYSTEP_TEST_DB"])
    assert server is not None, "this test restarts the server, so it must be the suite's own"
    directory, run, holder_name, holder, watcher = held_in_its_first_step(
        spawn_worker, tmp_path, watcher="watcher"
    )
    server.stop()
    try:
        time.sleep(2 * TIMEOUT)  # the outage, longer than the timeout
    finally:
        server.start()
    back_at = time.monotonic()
    # The window in which a watcher that trusted the heartbeats' age would
    # recover the run: the run stays with its worker all along.
    while time.monotonic() - back_at < RECOVERED_WITHIN:
        held = query_until_reachable(lambda: holders([run]))
        assert held == {(Workflow.Status.RUNNING, holder_name)}, watcher.log()
        time.sleep(0.2)
    assert complete([run], [directory]) == [[1, 1]]
    assert holders([run]) == {(Workflow.Status.COMPLETED, holder_name)}
    assert "recovered" not in watcher.log()
    for worker in (holder, watcher):
        worker.send(signal.SIGTERM)
        assert worker.wait() == 0, worker.log()


@pytest.mark.parametrize(
    ("flags", "env", "message"),
    [
        (["--orphan-timeout", "soon"], None, "--orphan-timeout 'soon' is not a duration"),
        (["--orphan-timeout=2d"], None, "--orphan-timeout '2d' must be 0 (off) or from 10s"),
        (["--orphan-timeout=5s"], None, "--orphan-timeout '5s' must be 0 (off) or from 10s"),
        ([], {"EVERYSTEP_ORPHAN_TIMEOUT": "2w"}, "EVERYSTEP_ORPHAN_TIMEOUT='2w' is not a duration"),
    ],
)
def test_a_bad_orphan_timeout_exits_2_with_one_line(spawn_worker, flags, env, message):
    worker = spawn_worker("misconfigured", *flags, env=env)
    assert worker.wait() == 2
    lines = worker.log().strip().splitlines()
    assert len(lines) == 1 and message in lines[0], worker.log()
