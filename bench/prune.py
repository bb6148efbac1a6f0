"""Retention at scale: pruning 1,000,000 finished runs while a worker runs
new work.

`runs` completed runs that ended 60 days ago and more, each with one
recorded step, are bulk-loaded (``INSERT … SELECT``, as `bench.claims`
loads) and the tables ANALYZEd. One worker process (``--poll 0.2``) idles
beside them. Then, before and during ``prune --older-than 30d``
(`everystep.control.actions.prune`, on a thread of this process):

- the **pickup** of a run, as `bench.pickup` measures it: ``schedule()``
  to its first step's start, one probe run at a time;
- a **claim**, timed on a thread of its own every 20 ms: the worker's claim
  statement (`everystep.db.claims.claim`) for a workflow that has no runs,
  so it takes nothing from the worker, yet reads and locks what a claim
  reads and locks;
- during the prune, each **batch**'s transaction, from its start to its
  commit: how long the rows it deletes stay locked (on SQLite, the whole
  database's write lock; between two batches its writers get a pause,
  `retention.yield_to_writers`).

The promise: no claim waits more than 100 ms for the prune. The figures:
the prune's time, runs and rows (runs and steps) per second, and the p50,
p99 and max of the pickups, the claims and the batches.
"""

import datetime
import os
import random
import socket
import threading
import time

from django.db import connection, connections, transaction

from bench import claims as claims_bench
from bench import workflows
from bench.common import Workers, percentile
from bench.db import Dialect, analyze
from bench.pickup import WARM_UP, latency, scheduled
from everystep.control import actions
from everystep.core import clock
from everystep.db import claims, retention

DAY_MS = 86_400_000
RETENTION = 30 * 86400.0  # seconds: prune --older-than 30d
CLAIM_EVERY = 0.02  # seconds between two timed claims
NO_RUNS = ["bench.workflows.no_such_workflow"]  # a claim that takes nothing


def load_ended_runs(count):
    """Bulk-load `count` completed runs that ended 60 days ago and more, one
    a second (`bench.claims`), then one done step for each; then ANALYZE."""
    ended_ms = f"{{now}} - {60 * DAY_MS} - i * 1000"
    claims_bench.load_runs(count, "completed", ended_ms, ended_ms, done=True, ended_ms=ended_ms)
    sql = Dialect(connection.vendor)
    no_args, no_kwargs, result = (sql.json(f"'{value}'") for value in ("[]", "{}", "1"))
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO everystep_step "
            "(workflow_id, step_id, name, args, kwargs, status, result, started_at, "
            "finished_at, attempts) "
            f"SELECT id, '1', 'bench.workflows.started_at', {no_args}, {no_kwargs}, 'done', "
            f"{result}, completed_at, completed_at, 1 "
            "FROM everystep_workflow WHERE status = 'completed'"
        )
    analyze("everystep_workflow", "everystep_step", vacuum=True)


class ClaimTimer:
    """Times a claim every `CLAIM_EVERY` seconds on a thread of its own."""

    def __init__(self):
        self.timings = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(30)

    def _run(self):
        try:
            while not self._stop.wait(CLAIM_EVERY):
                began = time.perf_counter()
                claims.claim("bench-prune-probe", 8, workflows=NO_RUNS)
                self.timings.append(time.perf_counter() - began)
        finally:
            connections.close_all()


class Pruning:
    """``prune --older-than 30d`` on a thread of its own: the loop of
    `actions.prune` (a batch, then the pause SQLite's writers get), each
    batch's transaction timed, from its start to its commit."""

    def __init__(self):
        self.batches = []
        self.deleted = 0
        self.seconds = None
        self.error = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self._thread.start()

    @property
    def running(self):
        return self._thread.is_alive()

    def join(self, timeout):
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the prune did not end within {timeout}s")
        if self.error is not None:
            raise self.error

    def _run(self):
        before = clock.now() - datetime.timedelta(seconds=RETENTION)
        began = time.perf_counter()
        try:
            while True:
                batch_began = time.perf_counter()
                deleted = retention.delete_batch(before, actions.PRUNED_BY_DEFAULT)
                if not deleted:
                    break
                self.batches.append(time.perf_counter() - batch_began)
                self.deleted += deleted
                retention.yield_to_writers()
        except BaseException as exc:  # noqa: BLE001 - raised again by join()
            self.error = exc
        finally:
            self.seconds = time.perf_counter() - began
            connections.close_all()


def pickup(rng, probe, poll):
    """One probe run's pickup in seconds (`bench.pickup`), once it completed."""
    return latency(probe, scheduled(None, rng, poll))


def measure(runs=1_000_000, samples=100, poll=0.2, log_dir=".", seed=1, timeout=1800):
    rng = random.Random(seed)
    began = time.perf_counter()
    load_ended_runs(runs)
    loaded = time.perf_counter() - began
    url = os.environ["EVERYSTEP_DATABASE_URL"]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        env = {workflows.PROBE_ADDRESS: f"127.0.0.1:{probe.getsockname()[1]}"}
        with Workers(1, ["--poll", str(poll)], url, log_dir, prefix="bench-prune", env=env) as w:
            w.wait_ready()
            for _ in range(WARM_UP):
                pickup(rng, probe, poll)
            with ClaimTimer() as claims_before:
                before = [pickup(rng, probe, poll) for _ in range(samples)]
            pruning = Pruning()
            with ClaimTimer() as claims_during:
                pruning.start()
                during = []
                while pruning.running:
                    during.append(pickup(rng, probe, poll))
                pruning.join(timeout)
    rows = 2 * pruning.deleted  # each run and its step
    return {
        "runs": runs,
        "load_seconds": loaded,
        "pruned_runs": pruning.deleted,
        "prune_seconds": pruning.seconds,
        "runs_per_second": pruning.deleted / pruning.seconds,
        "rows_per_second": rows / pruning.seconds,
        "batches": len(pruning.batches),
        **_spread("batch", pruning.batches),
        **_spread("claim_before", claims_before.timings),
        **_spread("claim_during", claims_during.timings),
        **_spread("pickup_before", before),
        **_spread("pickup_during", during),
        "pickup_during_samples": len(during),
    }


def _spread(name, seconds):
    """p50, p99 and max of `seconds`, in milliseconds, named after `name`."""
    return {
        f"{name}_p50_ms": percentile(seconds, 0.5) * 1e3,
        f"{name}_p99_ms": percentile(seconds, 0.99) * 1e3,
        f"{name}_max_ms": max(seconds) * 1e3,
    }
