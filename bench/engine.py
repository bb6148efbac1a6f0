"""In-process measurements of the engine against one database.

Run as ``python -m bench.engine SECTION [OPTIONS]`` with
``DJANGO_SETTINGS_MODULE=bench.settings`` and ``EVERYSTEP_DATABASE_URL`` set;
prints one JSON object of figures. `bench.__main__` runs it once per section
and backend, each against a freshly migrated database.

- ``steps``: the physical limit (autocommit INSERTs of a step-shaped row on
  the raw driver connection) and the recorded step cost (a run of 200
  trivial steps through the runner), interleaved, with the round trips per
  step counted from the connection.
- ``claims``: the claim's latency on an empty queue and with 8 runs waiting,
  then again with 1,000,000 finished runs in the table.
- ``replay``: resuming a run with 1,000 recorded steps.
- ``throughput``: worker processes draining a queue of runs.
- ``pickup``: an idle worker's delay from ``schedule()``'s commit to the start
  of the run's first step.
- ``footprint``: a worker's memory, idle and after 2,000 runs.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid

import django

django.setup()

from django.db import connection, transaction  # noqa: E402

from bench import workflows  # noqa: E402
from everystep import runner, schedule, store  # noqa: E402
from everystep.models import Workflow  # noqa: E402


class RoundTrips:
    """Counts the statements this thread's connection sends."""

    def __init__(self):
        self.count = 0

    def __call__(self, execute, sql, params, many, context):
        self.count += 1
        return execute(sql, params, many, context)


def median(values):
    return statistics.median(values)


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


# The physical limit and the recorded step.

LIMIT_TABLE = {
    "postgresql": "CREATE TABLE bench_limit (workflow_id uuid, step_id varchar(300), result jsonb)",
    "mysql": "CREATE TABLE bench_limit (workflow_id char(32), step_id varchar(300), result json)",
    "sqlite": "CREATE TABLE bench_limit (workflow_id char(32), step_id varchar(300), result text)",
}


def physical_limit(count):
    """Seconds per autocommit INSERT of a step-shaped row, on the driver."""
    connection.ensure_connection()
    raw = connection.connection
    marker = "?" if connection.vendor == "sqlite" else "%s"
    sql = f"INSERT INTO bench_limit VALUES ({marker}, {marker}, {marker})"
    workflow_id = uuid.uuid4() if connection.vendor == "postgresql" else uuid.uuid4().hex
    cursor = raw.cursor()
    began = time.perf_counter()
    for i in range(count):
        cursor.execute(sql, (workflow_id, str(i), json.dumps({"value": i})))
        if connection.vendor == "sqlite":
            raw.commit()  # sqlite3's driver opens a transaction on INSERT
    elapsed = time.perf_counter() - began
    cursor.close()
    return elapsed / count


def recorded_steps(count):
    """Seconds and round trips per step of one run of `count` trivial steps."""
    schedule(workflows.steps, count)
    [claimed] = store.claim("bench", 1)
    trips = RoundTrips()
    with connection.execute_wrapper(trips):
        began = time.perf_counter()
        runner.execute(claimed)
        elapsed = time.perf_counter() - began
    # One query loads the (empty) record and one finishes the run.
    return elapsed / count, (trips.count - 2) / count


def section_steps(args):
    with connection.cursor() as cursor:
        cursor.execute(LIMIT_TABLE[connection.vendor])
    if connection.vendor == "sqlite":
        connection.connection.isolation_level = None  # driver autocommit
    physical_limit(50)
    recorded_steps(20)  # warm up both paths
    limits, costs, trips = [], [], []
    for _ in range(args.repeat):
        limits.append(physical_limit(args.count * 2))
        cost, per_step = recorded_steps(args.count)
        costs.append(cost)
        trips.append(per_step)
    return {
        "physical_limit_us": median(limits) * 1e6,
        "step_us": median(costs) * 1e6,
        "step_round_trips": median(trips),
        "step_vs_limit": median(costs) / median(limits),
    }


# The claim at scale.


def claim_latency(samples, waiting):
    """Median seconds of `store.claim(…, 8)` with `waiting` runs scheduled."""
    timings = []
    for _ in range(samples):
        ids = [schedule(workflows.one_step).id for _ in range(waiting)]
        began = time.perf_counter()
        store.claim("bench", 8)
        timings.append(time.perf_counter() - began)
        Workflow.objects.filter(id__in=ids).delete()
    return median(timings)


def load_finished_runs(count):
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "INSERT INTO everystep_workflow (id, name, args, status, created_at, completed_at) "
                "SELECT gen_random_uuid(), 'bench.workflows.one_step', '[]', 'completed', "
                "now() - make_interval(secs => g), now() FROM generate_series(1, %s) g",
                [count],
            )
            cursor.execute("ANALYZE everystep_workflow")
        else:
            cursor.execute(
                "INSERT INTO everystep_workflow (id, name, args, status, created_at, completed_at) "
                "SELECT REPLACE(UUID(), '-', ''), 'bench.workflows.one_step', '[]', 'completed', "
                "NOW(6), NOW(6) FROM seq_1_to_%s" % int(count)
            )
            cursor.execute("ANALYZE TABLE everystep_workflow")


def section_claims(args):
    claim_latency(20, 8)
    empty_idle, empty_busy = claim_latency(args.samples, 0), claim_latency(args.samples, 8)
    load_finished_runs(args.finished)
    full_idle, full_busy = claim_latency(args.samples, 0), claim_latency(args.samples, 8)
    return {
        "claim_empty_table_idle_us": empty_idle * 1e6,
        "claim_empty_table_8_waiting_us": empty_busy * 1e6,
        "claim_finished_runs": args.finished,
        "claim_full_table_idle_us": full_idle * 1e6,
        "claim_full_table_8_waiting_us": full_busy * 1e6,
        "claim_ratio_8_waiting": full_busy / empty_busy,
        "claim_ratio_idle": full_idle / empty_idle,
    }


# Replay.


def section_replay(args):
    run = schedule(workflows.steps, args.count)
    runner.execute(store.claim("bench", 1)[0])
    timings, queries = [], []
    for _ in range(args.repeat):
        Workflow.objects.filter(id=run.id).update(status="scheduled", claimed_by=None)
        [claimed] = store.claim("bench", 1)
        trips = RoundTrips()
        with connection.execute_wrapper(trips):
            began = time.perf_counter()
            runner.execute(claimed)
            timings.append(time.perf_counter() - began)
        queries.append(trips.count)
    return {
        "replay_steps": args.count,
        "replay_ms": median(timings) * 1e3,
        "replay_queries": median(queries),
    }


# Worker processes.


def start_worker(name, *flags, log_dir):
    """A ``manage.py everystep_worker`` subprocess; returns (process, log path)."""
    log = os.path.join(log_dir, f"{name}.log")
    command = [sys.executable, "-m", "django", "everystep_worker", "--name", name, *flags]
    with open(log, "wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    return process, log


def wait_for(condition, timeout, what):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


def ready(log):
    with open(log, errors="replace") as text:
        return " ready: " in text.read()


def stop_workers(workers):
    for process, _ in workers:
        process.terminate()
    for process, _ in workers:
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def section_throughput(args):
    workflow = getattr(workflows, args.workflow)
    workers = [
        start_worker(f"bench-{i}", "--pool", str(args.pool), log_dir=args.log_dir)
        for i in range(args.workers)
    ]
    try:
        for _, log in workers:
            wait_for(lambda log=log: ready(log), 120, "a worker ready")
        name = workflow.__everystep_workflow__
        with transaction.atomic():
            Workflow.objects.bulk_create(
                [Workflow(name=name, args=[]) for _ in range(args.runs)], batch_size=1000
            )
        began = time.perf_counter()
        wait_for(
            lambda: not Workflow.objects.exclude(status="completed").exists(),
            args.timeout,
            f"{args.runs} runs completed",
        )
        elapsed = time.perf_counter() - began
    finally:
        stop_workers(workers)
    failed = Workflow.objects.exclude(status="completed").count()
    return {
        "runs": args.runs,
        "seconds": elapsed,
        "runs_per_s": args.runs / elapsed,
        "not_completed": failed,
    }


def section_pickup(args):
    flags = ["--pool", "4", "--poll", "0.2"] + (["--no-notify"] if args.no_notify else [])
    workers = [start_worker("bench-pickup", *flags, log_dir=args.log_dir)]
    delays = []
    try:
        wait_for(lambda: ready(workers[0][1]), 120, "the worker ready")
        for _ in range(args.samples):
            time.sleep(0.005 + (hash(uuid.uuid4()) % 1000) / 1000 * 0.02)  # spaced randomly
            run = schedule(workflows.pickup_probe)  # autocommit: committed on return
            committed = time.time()
            wait_for(
                lambda: Workflow.objects.filter(id=run.id, status="completed").exists(), 30, "a run"
            )
            delays.append(Workflow.objects.get(id=run.id).result - committed)
    finally:
        stop_workers(workers)
    return {
        "pickup_p50_ms": percentile(delays, 0.5) * 1e3,
        "pickup_p99_ms": percentile(delays, 0.99) * 1e3,
    }


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return None


def section_footprint(args):
    workers = [start_worker("bench-footprint", "--pool", "8", log_dir=args.log_dir)]
    process = workers[0][0]
    try:
        wait_for(lambda: ready(workers[0][1]), 120, "the worker ready")
        time.sleep(1)
        idle = rss_kib(process.pid)
        name = workflows.one_step.__everystep_workflow__
        with transaction.atomic():
            Workflow.objects.bulk_create(
                [Workflow(name=name, args=[]) for _ in range(args.runs)], batch_size=1000
            )
        wait_for(
            lambda: not Workflow.objects.exclude(status="completed").exists(), args.timeout, "runs"
        )
        after = rss_kib(process.pid)
    finally:
        stop_workers(workers)
    return {
        "worker_rss_idle_mib": idle / 1024,
        "worker_rss_after_runs_mib": after / 1024,
        "footprint_runs": args.runs,
    }


SECTIONS = {
    "steps": section_steps,
    "claims": section_claims,
    "replay": section_replay,
    "throughput": section_throughput,
    "pickup": section_pickup,
    "footprint": section_footprint,
}


def main():
    parser = argparse.ArgumentParser(prog="python -m bench.engine")
    parser.add_argument("section", choices=SECTIONS)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--finished", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--pool", type=int, default=8)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--workflow", default="five_steps")
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--no-notify", action="store_true")
    parser.add_argument("--log-dir", default=".")
    args = parser.parse_args()
    print(json.dumps(SECTIONS[args.section](args)))


if __name__ == "__main__":
    main()
