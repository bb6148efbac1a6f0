"""A real kernel partition between a worker and its database (§10).

The worker and a throwaway database server run together inside a private
network namespace (`tests.netns`); nftables then drops every packet between
them, both directions, without a reset or an ICMP error, the way a pulled
cable or a failed-over host looks to the kernel. The same promises as
`tests/test_silent_database.py`, which goes through a TCP proxy, hold here:
the outage is noticed, the runs complete after the heal, SIGTERM exits in
time naming the runs left parked, and a dead worker's name comes back.
"""

import json
import signal
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass

import pytest

from tests.helpers import driver_connection, opened, started, wait_until
from tests.netns import Namespace, NamespacedServer
from tests.plugin import current_backend
from tests.workerproc import REPO, manage_py_environment, timed_wait

pytestmark = pytest.mark.backends("postgres", "mariadb")

NOTICED_WITHIN = 30  # seconds from the partition to the worker's outage log
COMPLETED_WITHIN = 15  # seconds from the heal to every run completed
DRAIN = 5  # the stopped worker's --drain
EXIT_WITHIN = DRAIN + 10  # seconds from SIGTERM to the worker's exit
NAME_BACK_WITHIN = 60  # seconds from the heal to the dead worker's runs completed
# Longer than the name lock's server session may stay idle (30 s): the
# server ends that session while the worker is cut off from it.
LONG_PARTITION = 45

SCHEDULE = """
import json, sys
import django
django.setup()
from everystep import schedule
from tests import workflows
workflow, args, count = getattr(workflows, sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
print(json.dumps([str(schedule(workflow, *args).id) for _ in range(count)]))
"""


@dataclass
class Inside:
    """A namespace with a migrated database server in it, and the environment
    of the processes started there to use it."""

    ns: Namespace
    server: NamespacedServer
    env: dict

    def python(self, *args, timeout=120):
        """Run `python args` inside, in the repository, on the server; return its output."""
        result = self.ns.run(
            [sys.executable, *args],
            env=self.env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert result.returncode == 0, f"{args[:3]} exited {result.returncode}:\n{result.stderr}"
        return result.stdout

    def schedule(self, workflow, args, count):
        """Schedule `count` runs of tests.workflows.<workflow>(*args); their ids."""
        return json.loads(self.python("-c", SCHEDULE, workflow, json.dumps(args), str(count)))

    def runs(self, run_ids):
        """{run id: (status, claimed_by)} of `run_ids`, read on a new connection."""
        rows = self.ns.call(read_runs, self.server.url)
        wanted = set(run_ids)
        return {run_id: row for run_id, row in rows.items() if run_id in wanted}

    def statuses(self, run_ids):
        """How many of `run_ids` are in each status, e.g. {"completed": 3}."""
        return dict(Counter(status for status, _ in self.runs(run_ids).values()))

    def all_running_under(self, run_ids, name):
        rows = self.runs(run_ids)
        return len(rows) == len(run_ids) and all(row == ("running", name) for row in rows.values())

    def worker(self, spawn_process, name, *args, group=None):
        """Start `everystep_worker --name name args` inside (under the group id
        `group`, for a partition of its own); it is killed by PID at the end."""
        command = self.ns.command(
            [sys.executable, "-m", "django", "everystep_worker", "--name", name, "--poll", "0.05"]
            + list(args),
            group,
        )
        return spawn_process(name, command, env=self.env)


def read_steps(url):
    """Every step's (run id, status) in recorded order."""
    rows = read(url, "SELECT workflow_id, status FROM everystep_step ORDER BY id")
    return [(str(uuid.UUID(str(run_id))), status) for run_id, status in rows]


def read_runs(url):
    """Every run's (status, claimed_by) by id."""
    rows = read(url, "SELECT id, status, claimed_by FROM everystep_workflow")
    return {str(uuid.UUID(str(run_id))): (status, claimed) for run_id, status, claimed in rows}


def read(url, sql):
    """The rows of `sql`, on a connection of its own, closed after."""
    conn = driver_connection(url, timeout=5, read_timeout=10)
    try:
        with conn.cursor() as cursor:
            cursor.execute(sql)
            return cursor.fetchall()
    finally:
        conn.close()


@pytest.fixture
def inside():
    """A fresh namespace and server per test: what one partition leaves
    behind (runs parked, writes delivered late) touches no other test."""
    with Namespace() as ns:
        server = ns.start_server(current_backend())
        env = manage_py_environment({"EVERYSTEP_DATABASE_URL": server.url})
        yielded = Inside(ns, server, env)
        yielded.python("-m", "django", "migrate", "-v", "0", timeout=300)
        try:
            yield yielded
        finally:
            ns.heal()


@pytest.mark.parametrize(
    "held",
    [0, LONG_PARTITION],
    ids=["healed once noticed", f"held {LONG_PARTITION}s, past the lock session's idle timeout"],
)
def test_a_partition_is_noticed_within_30s_and_runs_complete_within_15s_of_the_heal(
    inside, spawn_process, held
):
    worker = inside.worker(spawn_process, "patient", "--pool", "4").wait_ready()
    runs = inside.schedule("napping", [0.2, 10], 8)
    wait_until(
        lambda: inside.statuses(runs).get("completed", 0) >= 1, timeout=60, message="work under way"
    )
    assert "database unreachable" not in worker.log()

    inside.ns.partition(inside.server.port)
    cut_at = time.monotonic()
    worker.wait_for_log("database unreachable", timeout=NOTICED_WITHIN + 30)
    noticed = time.monotonic() - cut_at
    assert noticed < NOTICED_WITHIN, f"noticed after {noticed:.1f}s:\n{worker.log()}"
    if held:
        time.sleep(max(0.0, held - (time.monotonic() - cut_at)))  # the partition's length

    before_heal = len(worker.log())
    inside.ns.heal()
    healed_at = time.monotonic()
    wait_until(
        lambda: inside.statuses(runs) == {"completed": len(runs)},
        timeout=COMPLETED_WITHIN + 60,
        message="every run completed after the heal",
    )
    completed = time.monotonic() - healed_at
    partition = healed_at - cut_at
    print(
        f"\n[{current_backend()}] partition of {partition:.1f}s: noticed in {noticed:.1f}s, "
        f"every run completed {completed:.1f}s after the heal"
    )
    assert completed < COMPLETED_WITHIN, (
        f"runs completed {completed:.1f}s after the heal:\n{worker.log()}"
    )
    # One outage, logged once: nothing answers during the partition, so its
    # end is logged after the heal and only then.
    log = worker.log()
    during, after = log[:before_heal], log[before_heal:]
    assert during.count("database unreachable") == 1, f"the outage logged more than once:\n{log}"
    assert "reachable again" not in during, f"an end of the outage logged during it:\n{log}"
    assert after.count("database reachable again") == 1, log
    assert "database unreachable" not in after, log
    worker.send(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.log()


@pytest.mark.parametrize(
    "when", ["as the partition begins", "once the outage is noticed"], ids=lambda when: when
)
def test_sigterm_during_a_partition_exits_within_drain_plus_10s_naming_the_parked_runs(
    inside, spawn_process, when
):
    worker = inside.worker(spawn_process, "cut-off", "--pool", "2", "--drain", str(DRAIN))
    worker.wait_ready()
    runs = inside.schedule("napping", [0.5, 40], 2)
    wait_until(
        lambda: inside.all_running_under(runs, "cut-off"),
        timeout=60,
        message="both runs in flight",
    )

    inside.ns.partition(inside.server.port)
    if when == "once the outage is noticed":
        worker.wait_for_log("database unreachable", timeout=NOTICED_WITHIN + 30)
    worker.send(signal.SIGTERM)
    code, seconds = timed_wait(worker, EXIT_WITHIN + 60)
    print(
        f"\n[{current_backend()}] SIGTERM {when}: exited {code} in {seconds:.1f}s "
        f"with --drain {DRAIN}"
    )
    log = worker.log()
    assert seconds < EXIT_WITHIN, f"took {seconds:.1f}s to exit with --drain {DRAIN}:\n{log}"
    assert code == 0, log
    parked = [line for line in log.splitlines() if "stay claimed" in line]
    assert parked, log
    assert all(run_id in parked[-1] for run_id in runs), log
    assert "stopped" in log.strip().splitlines()[-1], log


@pytest.mark.parametrize(
    "held",
    [0, LONG_PARTITION],
    ids=[
        "healed once it is dead",
        f"held {LONG_PARTITION}s: its kernel gives its sockets up, the server ends its sessions",
    ],
)
def test_a_worker_killed_during_a_partition_gets_its_name_back_and_its_runs_finish_after_the_heal(
    inside, spawn_process, held
):
    doomed = inside.worker(spawn_process, "doomed", "--pool", "2").wait_ready()
    runs = inside.schedule("napping", [0.5, 10], 2)
    wait_until(
        lambda: inside.all_running_under(runs, "doomed"), timeout=60, message="both runs in flight"
    )

    inside.ns.partition(inside.server.port)
    cut_at = time.monotonic()
    doomed.wait_for_log("database unreachable", timeout=NOTICED_WITHIN + 30)
    doomed.kill()  # SIGKILL: its sessions stay open on the server, its runs claimed
    killed_after = time.monotonic() - cut_at
    if held:
        time.sleep(max(0.0, held - (time.monotonic() - cut_at)))  # the partition's length

    inside.ns.heal()
    healed_at = time.monotonic()
    successor = inside.worker(spawn_process, "doomed", "--pool", "2", "--drain", "90")
    wait_until(
        lambda: inside.statuses(runs) == {"completed": len(runs)},
        timeout=NAME_BACK_WITHIN + 60,
        message="the dead worker's runs completed under its name",
    )
    took = time.monotonic() - healed_at
    waited = "held by a live worker" in successor.log()
    print(
        f"\n[{current_backend()}] killed {killed_after:.1f}s into a partition of "
        f"{healed_at - cut_at:.1f}s; after the heal "
        f"the successor {'waited for' if waited else 'got'} the name and completed its runs "
        f"in {took:.1f}s"
    )
    assert took < NAME_BACK_WITHIN, (
        f"the runs completed {took:.1f}s after the heal:\n{successor.log()}"
    )
    resumed = [line for line in successor.log().splitlines() if "resumed parked" in line]
    assert resumed and all(any(run_id in line for line in resumed) for run_id in runs), (
        successor.log()
    )
    successor.send(signal.SIGTERM)
    assert successor.wait(30) == 0, successor.log()


def test_a_worker_cut_off_alone_is_recovered_and_its_late_writes_are_dropped_after_the_heal(
    inside, spawn_process, tmp_path
):
    """One worker loses the network while another keeps it. The server ends
    the cut-off worker's sessions, its name lock's with them, and the other
    worker recovers its run and completes it. Healed, the cut-off worker
    finishes the step it was in: its write is refused, each step is recorded
    once, and it goes on under its name."""
    cut_off = 4242
    [run] = inside.schedule("gated", [str(tmp_path)], 1)
    lost = inside.worker(spawn_process, "cut-off", group=cut_off).wait_ready()
    started(tmp_path, "first")
    rescuer = inside.worker(spawn_process, "rescuer", "--orphan-timeout", "10").wait_ready()

    inside.ns.partition(inside.server.port, group=cut_off)
    cut_at = time.monotonic()
    try:
        wait_until(
            lambda: inside.runs([run])[run] == ("running", "rescuer"),
            timeout=90,
            message="the rescuer holds the cut-off worker's run",
        )
        recovered_after = time.monotonic() - cut_at
        wait_until(lambda: (tmp_path / "first.started").read_text() == "xx")
        opened(tmp_path, "first")
        opened(tmp_path, "second")
        wait_until(
            lambda: inside.runs([run])[run] == ("completed", "rescuer"),
            message="the rescuer completed the run",
        )
    finally:
        inside.ns.heal()
    print(f"\n[{current_backend()}] recovered {recovered_after:.1f}s into the partition")
    lost.wait_for_log("lost its claim", timeout=90)
    assert (tmp_path / "first.passed").read_text() == "xx"  # both passed the first gate...
    steps = inside.ns.call(read_steps, inside.server.url)
    assert steps == [(run, "done"), (run, "done")]  # ...and one of them was recorded
    assert "recovered 1 run(s) of worker cut-off" in rescuer.log()
    for worker in (lost, rescuer):
        worker.send(signal.SIGTERM)
        assert worker.wait(60) == 0, worker.log()
