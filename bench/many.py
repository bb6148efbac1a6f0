"""Many workers on one PostgreSQL: `workers` worker processes, pool `pool`
each, against one database — directly, or through PgBouncer in transaction
mode (`pooler_url`; the workers' sessions then go direct, as
``EVERYSTEP_SESSION_URL`` says). The plan pairs 16 workers of pool 2 with
one worker of pool 32: the same total pool.

Once every worker is ready and counts all its peers:

- the idle connections the workers hold on the server (``pg_stat_activity``;
  behind the pooler, its server connections included), against
  ``max_connections``;
- a trickle: `trickle` runs scheduled one at a time, each once the one
  before was claimed, so that every run finds all the workers idle — the
  worst case for a notification that wakes them all. The claims the server
  executed per run (``pg_stat_statements``, reset first) and the pickup,
  from the run's creation to its claim;
- a drain: `runs` five-step runs scheduled in one transaction, the clock
  running until all are completed: runs per second, claims per run, the
  workers' CPU per run, and how often a backend waited on a lock (samples
  of ``pg_stat_activity`` every 20 ms with a ``Lock`` wait event).
"""

import collections
import os
import threading
import time

from django.db import connection, connections

from bench import db, workflows
from bench.common import MachineCPU, Workers, median, percentile, wait_for
from everystep import schedule
from everystep.models import Workflow

CLAIMS_SQL = """
    SELECT coalesce(sum(calls), 0) FROM pg_stat_statements
     WHERE query LIKE %s
       AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
"""
# The claim's UPDATE, and only it, whether the server shows its constants
# or, normalized, as parameters.
CLAIM_FRAGMENT = "%claimed_by = %claimed_at = %started_at = COALESCE(started_at%"


def execute(sql):
    with connection.cursor() as cursor:
        cursor.execute(sql)


def scalar(sql, params=()):
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()[0]


def claims():
    return int(scalar(CLAIMS_SQL, [CLAIM_FRAGMENT]))


def server_connections():
    """Connections to this database other than this process's own."""
    return scalar(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )


class LockWaits:
    """Samples, every 20 ms on a connection of its own, whether a backend
    of this database waits on a lock, and on which kind (``object``: the
    lock a transaction takes to commit a NOTIFY; ``transactionid``,
    ``tuple``: a row another transaction holds)."""

    def __init__(self):
        self.samples = self.waiting = 0
        self.kinds = collections.Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self):
        db = connections.create_connection("default")
        try:
            with db.cursor() as cursor:
                while not self._stop.wait(0.02):
                    cursor.execute(
                        "SELECT wait_event FROM pg_stat_activity WHERE datname = "
                        "current_database() AND wait_event_type = 'Lock'"
                    )
                    kinds = [row[0] for row in cursor.fetchall()]
                    self.samples += 1
                    self.waiting += bool(kinds)
                    self.kinds.update(kinds)
        finally:
            db.close()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(10)

    @property
    def share(self):
        return self.waiting / self.samples if self.samples else None


def trickle_runs(count, timeout):
    """Schedule `count` runs one at a time, each once the one before was
    claimed; the pickups (seconds from creation to claim)."""
    run_ids = []
    for n in range(count):
        run = schedule(workflows.one_step)
        run_ids.append(run.id)
        wait_for(
            lambda run=run: Workflow.objects.filter(id=run.id).exclude(status="scheduled").exists(),
            timeout,
            f"run {n} claimed",
            interval=0.002,
        )
    wait_for(lambda: db.unfinished() == 0, timeout, "the trickle's runs to finish")
    rows = Workflow.objects.filter(id__in=run_ids).values_list("created_at", "claimed_at")
    return [(claimed - created).total_seconds() for created, claimed in rows]


def measure(workers=16, pool=2, runs=2000, trickle=200, pooler_url=None, log_dir=".", timeout=300):
    direct = os.environ["EVERYSTEP_DATABASE_URL"]
    execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    url, env = (pooler_url, {"EVERYSTEP_SESSION_URL": direct}) if pooler_url else (direct, {})
    flags = ["--pool", str(pool), "--poll", "0.2"]
    baseline = server_connections()
    with Workers(workers, flags, url, log_dir, prefix=f"many-{workers}w", env=env) as group:
        group.wait_ready(timeout=180)
        wait_for(
            lambda: all(worker.peers == workers for worker in group.all),
            60,
            "every worker to count its peers",
            interval=0.1,
        )
        db.clear_runs()
        idle_connections = server_connections() - baseline

        scalar("SELECT pg_stat_statements_reset()")
        pickups = trickle_runs(trickle, timeout)
        trickle_claims = claims()
        db.clear_runs()

        scalar("SELECT pg_stat_statements_reset()")
        cpu_before = sum(worker.cpu_seconds() for worker in group.all)
        machine = MachineCPU().start()
        with LockWaits() as locks:
            db.schedule_many(workflows.five_steps, runs)
            began = time.perf_counter()
            wait_for(lambda: db.unfinished() == 0, timeout, f"{runs} runs to finish", 0.02)
            elapsed = time.perf_counter() - began
        busy = machine.busy()
        cpu = sum(worker.cpu_seconds() for worker in group.all) - cpu_before
        drain_claims = claims()
        outcomes = db.outcome_counts()
        if outcomes != {"completed": runs}:
            raise RuntimeError(f"runs ended {outcomes}, expected {runs} completed")
    return {
        "workers": workers,
        "pool": pool,
        "pooled": bool(pooler_url),
        "idle_server_connections": idle_connections,
        "max_connections": int(scalar("SHOW max_connections")),
        "trickle_runs": trickle,
        "trickle_claims_per_run": trickle_claims / trickle,
        "trickle_pickup_p50_ms": median(pickups) * 1e3,
        "trickle_pickup_p99_ms": percentile(pickups, 0.99) * 1e3,
        "drain_runs": runs,
        "drain_runs_per_s": runs / elapsed,
        "drain_claims_per_run": drain_claims / runs,
        "drain_worker_cpu_ms_per_run": cpu / runs * 1e3,
        "drain_machine_cpu_busy": busy,
        "drain_lock_wait_share": locks.share,
        "drain_lock_waits_by_kind": dict(locks.kinds.most_common()),
    }
