"""Claims: concurrent workers take disjoint runs; a busy pool claims the
runs left a few at a time, and never leaves them waiting for its poll;
connections stay bounded; a claim's own commit waits for no disk."""

import re
import signal
import threading
import time
import uuid

import pytest
from django.db import connection, transaction
from django.utils import timezone

from everystep import schedule
from everystep.core.fence import Fence
from everystep.db import claims
from everystep.models import Step, Workflow
from everystep.worker.claimer import BATCH_WINDOW, Claimer
from everystep.worker.options import WorkerOptions
from everystep.worker.pool import Pool
from tests import workflows
from tests.helpers import opened, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

CLAIM_LINE = re.compile(r"worker (\S+) claimed \d+ run\(s\): (.*)")


def claimed_ids(worker):
    """Every run id the worker's log says it claimed, in order."""
    return [
        run_id
        for match in CLAIM_LINE.finditer(worker.log())
        for run_id in match.group(2).split(", ")
    ]


def run_all_with_workers(spawn_worker, runs_count, workers_count, *args):
    """Start the workers, and once every one is ready (a slow start would
    leave it nothing to claim), schedule the runs and let them drain."""
    workers = [
        spawn_worker(f"claimer-{i}", "--pool", "4", "--poll", "0.05", *args)
        for i in range(workers_count)
    ]
    for worker in workers:
        worker.wait_ready()
    runs = [schedule(workflows.quick, n).id for n in range(runs_count)]
    wait_until(
        lambda: Workflow.objects.filter(status="completed").count() == runs_count,
        timeout=240,
        message=f"{runs_count} runs completed",
    )
    for worker in workers:
        worker.send(signal.SIGTERM)
    for worker in workers:
        assert worker.wait() == 0, worker.log()
    return runs, workers


@pytest.mark.backends("postgres", "mariadb")
def test_four_concurrent_workers_claim_500_runs_disjointly(spawn_worker):
    runs, workers = run_all_with_workers(spawn_worker, 500, 4)
    claims = [run_id for worker in workers for run_id in claimed_ids(worker)]
    assert len(claims) == 500 and set(claims) == {str(r) for r in runs}  # each exactly once
    assert all(claimed_ids(worker) for worker in workers), "every worker took a share"
    assert Step.objects.count() == 2 * 500
    owners = dict(Workflow.objects.values_list("id", "claimed_by"))
    for worker in workers:
        assert all(owners[uuid.UUID(i)] == worker.name for i in claimed_ids(worker))


@pytest.mark.backends("sqlite")
def test_concurrent_workers_on_sqlite_claim_exclusively(spawn_worker):
    runs, workers = run_all_with_workers(spawn_worker, 100, 2)
    claims = [run_id for worker in workers for run_id in claimed_ids(worker)]
    assert sorted(claims) == sorted(str(r) for r in runs)
    assert Step.objects.count() == 2 * 100


def test_a_busy_pool_waits_moments_for_a_second_free_slot_before_claiming_the_runs_left():
    options = WorkerOptions(pool_size=8, name="batcher")
    pool = Pool(options, lambda: None, threading.Event())  # its threads are not started
    claimer = Claimer(options, pool, None, None, lambda: 1.0)

    def hold(count):
        for _ in range(count):
            fence = Fence(uuid.uuid4(), "tests.workflows.quick", uuid.uuid4(), options.name)
            pool.submit(claims.ClaimedRun(fence, [1], False, timezone.now(), None, False))

    assert claimer.backlog_in() == 0, "an idle pool claims at once"
    hold(6)
    assert claimer.backlog_in() == 0, "a quarter of the pool free: at once"
    hold(1)
    began = time.monotonic()
    # The whole window at first (to a float's rounding of the times it adds).
    waiting = claimer.backlog_in()
    assert waiting == pytest.approx(BATCH_WINDOW, abs=1e-6), "one slot free: it waits for company"
    wait_until(lambda: claimer.backlog_in() == 0, timeout=5, interval=0.001)
    assert time.monotonic() - began >= BATCH_WINDOW * 0.99  # a monotonic clock's rounding
    hold(1)
    assert claimer.backlog_in() == 0, "a full pool turns at once (and claims nothing)"
    claimer.may_find_more = False
    assert claimer.backlog_in() is None, "the last claim left nothing"


def test_a_single_free_slot_still_claims_the_runs_left_long_before_the_poll(spawn_worker, tmp_path):
    for n in range(8):
        schedule(workflows.held, str(tmp_path), f"held-{n}")
    worker = spawn_worker("batcher", "--pool", "8", "--poll", "60").wait_ready()
    wait_until(
        lambda: len(list(tmp_path.glob("held-*.started"))) == 8,
        timeout=60,
        message="the pool full of held runs",
    )
    quick = [schedule(workflows.quick, n).id for n in range(3)]
    opened(tmp_path, "held-0")  # one slot frees; seven runs stay held
    wait_until(
        lambda: Workflow.objects.filter(id__in=quick, status="completed").count() == 3,
        timeout=30,  # the poll is 60 s: only the claims of the runs left take them
        message="the runs left claimed one at a time by the one free slot",
    )
    assert Workflow.objects.filter(status="running").count() == 7
    for n in range(1, 8):
        opened(tmp_path, f"held-{n}")
    worker.send(signal.SIGTERM)
    assert worker.wait() == 0, worker.log()


def server_connections():
    """Connections the database server has open to the test database."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            )
        else:
            cursor.execute(
                "SELECT count(*) FROM information_schema.processlist WHERE db = DATABASE()"
            )
        return cursor.fetchone()[0]


@pytest.mark.backends("postgres", "mariadb")
def test_server_connections_stay_bounded_after_hundreds_of_runs(spawn_worker):
    pool = 4
    baseline = server_connections()
    worker = spawn_worker("frugal", "--pool", str(pool), "--poll", "0.05").wait_ready()
    runs = [schedule(workflows.fanned, n).id for n in range(300)]
    peak = 0

    def all_done():
        nonlocal peak
        peak = max(peak, server_connections() - baseline)
        return Workflow.objects.filter(id__in=runs, status="completed").count() == len(runs)

    wait_until(all_done, timeout=240, interval=0.05, message="300 runs with forks completed")
    idle = server_connections() - baseline
    # The loop's, the name lock's and the listener's connections, and at most
    # one per pool thread; branch threads close theirs after each branch.
    assert idle <= 3 + pool, f"{idle} connections left open by an idle worker"
    # Each in-flight run: its pool thread's connection plus three branch threads.
    assert peak <= 3 + pool * 4, f"peak of {peak} connections"
    worker.send(signal.SIGTERM)
    assert worker.wait() == 0


@pytest.mark.backends("postgres")
def test_a_claim_commits_without_waiting_for_the_disk_but_leaves_a_callers_commit_alone():
    """The claim's statement turns synchronous_commit off for its own
    transaction only (a claim lost in a server crash is claimed again, and
    the first durable write under it flushes it); inside a caller's
    transaction it leaves the caller's commit durable."""
    for n in range(3):
        schedule(workflows.quick, n)
    now = timezone.now()
    params = {
        "every": True,
        "served": [],
        "workflows": [workflows.quick.__everystep_workflow__],
        "now": now,
        "aged": now,
        "worker": "t",
        "token": uuid.uuid4(),
    }
    statement = claims.CLAIM_UNLIMITED.format(limit=1)
    for own_commit, setting in ((True, "off"), (False, "on")):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(statement, {**params, "own_commit": own_commit})
            assert len(cursor.fetchall()) == 1
            cursor.execute("SHOW synchronous_commit")
            assert cursor.fetchone() == (setting,)
    with transaction.atomic(), connection.cursor() as cursor:
        assert len(claims.claim("t", 1)) == 1  # in the caller's transaction
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone() == ("on",)
    assert Workflow.objects.filter(status="running").count() == 3
