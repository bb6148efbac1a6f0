"""The recorded step: what one step of a run costs, against the physical limit.

One thread executes a run of 200 trivial steps through `runner.execute`,
exactly as a worker's pool thread does once it has claimed the run. Its
time per step is compared with the physical limit (`bench.limits`),
measured on the same database in the same process, the two interleaved
repetition by repetition so that both see the same server and cache state;
each figure is the median of the repetitions.

Round trips are counted, not estimated: a Django ``execute_wrapper`` counts
every statement the connection sends while the run executes. A run costs
one query to load its recorded steps and one UPDATE to finish, so the round
trips per step are ``(statements - 2) / steps``. On PostgreSQL the write
transactions are counted too, from the server's transaction ids. The same
wrapper times the statements in the driver, which splits a step's cost into
the database's part and the engine's own Python. On PostgreSQL the number
of statements the connection has prepared on the server is reported too: a
step statement parsed and planned anew each time costs more than a
prepared one.

The cost of observability: the same run with the metrics subscribed to
the engine's events (`everystep.metrics`, as every worker has them) and
without any subscriber, interleaved repetition by repetition.

Also here: a sequential 5-step run (schedule, claim and execute on one
thread) — the figure DBOS Transact's direct workflow call is compared with.
"""

import time

from django.db import connection

from bench import workflows
from bench.common import RoundTrips, median
from bench.limits import PhysicalLimit
from everystep import events, metrics, runner, schedule, store


def transaction_id():
    """PostgreSQL's next transaction id (asking assigns one); None elsewhere."""
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_xact_id()::text::bigint")
        return cursor.fetchone()[0]


def recorded_run(count):
    """Execute one claimed run of `count` trivial steps; its seconds per
    step, seconds per step spent in the driver, statements and write
    transactions (None off PostgreSQL)."""
    schedule(workflows.steps, count)
    [claimed] = store.claim("bench-steps", 1)
    trips = RoundTrips()
    first = transaction_id()
    with connection.execute_wrapper(trips):
        began = time.perf_counter()
        status = runner.execute(claimed)
        elapsed = time.perf_counter() - began
    last = transaction_id()
    if status != "completed":
        raise RuntimeError(f"the {count}-step run ended {status}")
    writes = None if first is None else last - first - 1
    return elapsed / count, trips.seconds / count, trips.count, writes


def prepared_statements():
    """How many statements the connection has prepared on the server
    (PostgreSQL; None elsewhere)."""
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements")
        return cursor.fetchone()[0]


def sequential_run():
    """Seconds to schedule, claim and execute a 5-step run on this thread."""
    began = time.perf_counter()
    schedule(workflows.five_steps)
    [claimed] = store.claim("bench-steps", 1)
    runner.execute(claimed)
    return time.perf_counter() - began


def metrics_on_and_off(count, repeat):
    """Median seconds per recorded step without the metrics and with them
    subscribed to the engine's events, interleaved; they stay subscribed."""
    metrics.install()
    bare, counted = [], []
    for _ in range(repeat):
        events.unsubscribe(metrics.on_event)
        bare.append(recorded_run(count)[0])
        events.subscribe(metrics.on_event)
        counted.append(recorded_run(count)[0])
    return median(bare), median(counted)


def measure(count=200, repeat=7, sequential=50):
    limit = PhysicalLimit()
    try:
        durability = limit.durability()
        limit.per_commit(100)  # warm both paths: connections, prepared statements, caches
        recorded_run(50)
        limits, costs, waits, statements, writes = [], [], [], [], []
        for _ in range(repeat):
            limits.append(limit.per_commit(count))
            cost, waited, sent, written = recorded_run(count)
            costs.append(cost)
            waits.append(waited)
            statements.append(sent)
            writes.append(written)
    finally:
        limit.close()
    bare, counted = metrics_on_and_off(count, repeat)
    sequential_runs = [sequential_run() for _ in range(sequential)]
    figures = {
        "physical_limit_us": median(limits) * 1e6,
        "step_us": median(costs) * 1e6,
        "step_vs_limit": median(costs) / median(limits),
        "step_in_driver_us": median(waits) * 1e6,
        "step_without_subscribers_us": bare * 1e6,
        "step_with_metrics_us": counted * 1e6,
        "metrics_overhead": counted / bare,
        "run_statements": median(statements),
        "step_round_trips": (median(statements) - 2) / count,
        "steps_per_run": count,
        "sequential_5_step_run_ms": median(sequential_runs) * 1e3,
        "durability": durability,
    }
    if writes[0] is not None:
        figures["step_write_transactions"] = (median(writes) - 1) / count
        figures["prepared_statements"] = prepared_statements()
    return figures
