"""Throughput: real worker processes draining a queue.

`workers` worker processes (``python -m django everystep_worker``, pool 8
each) are started and left to become ready and idle. Then the runs are
scheduled in one transaction, as a bulk import would, and the clock runs
from its commit until every run is terminal (checked every 20 ms). A
warm-up batch comes first; the tables are emptied between repetitions and
the figure is the median. The workers' claim batches are counted from their
logs; their CPU time and resident memory, and the machine's busy CPU
fraction while they drain, are read from /proc (a drain that keeps every
core busy is bound by CPU, not by the database's commits).
"""

import os
import time

from bench import db, workflows
from bench.common import MachineCPU, Workers, median, wait_for


def drain(group, count, workflow, timeout):
    """Schedule `count` runs at once; the seconds until all are terminal,
    the workers' CPU seconds meanwhile and the machine's busy fraction."""
    cpu_before = sum(worker.cpu_seconds() for worker in group.all)
    machine = MachineCPU().start()
    db.schedule_many(workflow, count)
    began = time.perf_counter()
    wait_for(lambda: db.unfinished() == 0, timeout, f"{count} runs to finish", interval=0.02)
    elapsed = time.perf_counter() - began
    busy = machine.busy()
    cpu = sum(worker.cpu_seconds() for worker in group.all) - cpu_before
    outcomes = db.outcome_counts()
    if outcomes != {"completed": count}:
        raise RuntimeError(f"runs ended {outcomes}, expected {count} completed")
    return elapsed, cpu, busy


def measure(
    workers=1, pool=8, runs=2000, workflow="five_steps", repeat=3, log_dir=".", timeout=300
):
    body = getattr(workflows, workflow)
    steps = {"five_steps": 5, "one_step": 1}[workflow]
    flags = ["--pool", str(pool), "--poll", "0.2"]
    url = os.environ["EVERYSTEP_DATABASE_URL"]
    warm_up = min(runs, 200)
    with Workers(workers, flags, url, log_dir, prefix=f"bench-{workers}w") as group:
        group.wait_ready()
        rss_idle = [worker.rss_mib() for worker in group.all]
        drain(group, warm_up, body, timeout)  # warm-up: connections, statements, caches
        db.clear_runs()
        claims_before = sum(worker.claims for worker in group.all)
        timings, cpus, busies = [], [], []
        for _ in range(repeat):
            elapsed, cpu, busy = drain(group, runs, body, timeout)
            timings.append(elapsed)
            cpus.append(cpu)
            busies.append(busy)
            db.clear_runs()
        claims = sum(worker.claims for worker in group.all) - claims_before
        rss_after = [worker.rss_mib() for worker in group.all]
    seconds = median(timings)
    return {
        "runs": runs,
        "steps_per_run": steps,
        "seconds": seconds,
        "runs_per_s": runs / seconds,
        "steps_per_s": runs * steps / seconds,
        "runs_per_claim": runs * repeat / claims if claims else None,
        "worker_cpu_ms_per_run": median(cpus) / runs * 1e3,
        "machine_cpu_busy": median(busies),
        "worker_rss_idle_mib": max(rss_idle),
        "worker_rss_after_mib": max(rss_after),
        "runs_per_worker_after": (warm_up + runs * repeat) / workers,
    }
