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
prepared one. And the server's own side, from ``pg_stat_statements``
over the timed repetitions: the mean execution time of the step's fenced
INSERT and of the limit's plain one, and the WAL records and bytes each
writes (the fence's share lock on the run's row, the step's two indexes):
what the step statement costs the server beyond the INSERT, apart from
the commit both wait for and the client's Python.

The cost of observability: what a recorded step's own announcements cost
with the metrics subscribed (`everystep.observe.metrics`, as every worker has them),
with the spans too (`everystep.observe.tracing`) on OpenTelemetry's no-op tracer,
and on the SDK exporting in batches, less their cost with nothing
subscribed; shown as a share of the recorded step's time.

Also here: a sequential 5-step run (schedule, claim and execute on one
thread) — the figure DBOS Transact's direct workflow call is compared with.
"""

import contextlib
import time
import uuid

from django.db import connection
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from bench import workflows
from bench.common import RoundTrips, median
from bench.limits import PhysicalLimit
from everystep import schedule
from everystep.core import events
from everystep.db import claims
from everystep.engine import runner
from everystep.observe import metrics, tracing


def transaction_id():
    """PostgreSQL's next transaction id (asking assigns one); None elsewhere."""
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_xact_id()::text::bigint")
        return cursor.fetchone()[0]


def recorded_run(count):
    """Execute one claimed run of `count` trivial steps; its seconds per
    step, seconds per step spent in the driver, statements, write
    transactions (None off PostgreSQL)."""
    schedule(workflows.steps, count)
    [claimed] = claims.claim("bench-steps", 1)
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
    [claimed] = claims.claim("bench-steps", 1)
    runner.execute(claimed)
    return time.perf_counter() - began


def observability_costs(repeat=5, calls=20_000):
    """What observability adds to one recorded step, in seconds: the median
    cost of the step's own announcements (`step_started`, `step_recorded`)
    with the metrics subscribed, with the metrics and the spans on
    OpenTelemetry's no-op tracer, and with both on the SDK exporting in
    batches (as the runtime does), less their cost with nothing subscribed.
    Measured apart from the database, whose waits would drown it."""
    metrics.install()
    tracing.install()
    both = (metrics.on_event, tracing.on_event)
    variants = (("bare", ()), ("metrics", both[:1]), ("tracing_noop", both))
    costs = {variant: [] for variant, _ in variants}
    for _ in range(repeat):
        for variant, subscribed in variants:
            with subscribers(subscribed):
                costs[variant].append(_announcements(calls))
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(InMemorySpanExporter()))
    trace.set_tracer_provider(provider)
    costs["tracing_sdk"] = []
    for _ in range(repeat):
        with subscribers(both):
            costs["tracing_sdk"].append(_announcements(calls))
    provider.shutdown()
    bare = median(costs.pop("bare"))
    return {variant: median(values) - bare for variant, values in costs.items()}


def _announcements(calls):
    """Seconds per step of the events a recorded step announces."""
    run_id = uuid.uuid4()
    began = time.perf_counter()
    for _ in range(calls):
        events.announce(
            "step_started", run_id=run_id, workflow="bench.steps", step_id="1", step="bench.echo"
        )
        events.announce(
            "step_recorded",
            run_id=run_id,
            workflow="bench.steps",
            worker="bench-steps",
            step_id="1",
            step="bench.echo",
            status="done",
            seconds=0.0001,
            exception=None,
        )
    return (time.perf_counter() - began) / calls


@contextlib.contextmanager
def subscribers(callbacks):
    """Only `callbacks` (of the metrics and the spans) subscribed, meanwhile."""
    for callback in (metrics.on_event, tracing.on_event):
        events.unsubscribe(callback)
    for callback in callbacks:
        events.subscribe(callback)
    try:
        yield
    finally:
        for callback in callbacks:
            events.unsubscribe(callback)


# pg_stat_statements' rows of the two INSERTs compared, by their text's start.
SERVER_STATEMENTS = {"step": "INSERT INTO everystep_step ", "limit": "INSERT INTO bench_limit "}


def reset_statement_statistics():
    """Start PostgreSQL's statement statistics afresh; False where they are
    not kept (another backend, or a server without pg_stat_statements)."""
    if connection.vendor != "postgresql":
        return False
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_available_extensions WHERE name = 'pg_stat_statements'"
        )
        if not cursor.fetchone()[0]:
            return False
        cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        cursor.execute("SELECT pg_stat_statements_reset()")
    return True


def server_costs():
    """``{figure: value}`` of the server's side of the step's INSERT and the
    limit's, per call: execution µs, WAL records, WAL bytes."""
    figures = {}
    with connection.cursor() as cursor:
        for label, start in SERVER_STATEMENTS.items():
            cursor.execute(
                "SELECT sum(total_exec_time) / sum(calls) * 1000, "
                "sum(wal_records)::float / sum(calls), sum(wal_bytes)::float / sum(calls) "
                "FROM pg_stat_statements WHERE query LIKE %s AND calls > 0",
                [start + "%"],
            )
            executed, records, wal_bytes = cursor.fetchone()
            if executed is not None:
                figures[f"server_{label}_us"] = executed
                figures[f"server_{label}_wal_records"] = records
                figures[f"server_{label}_wal_bytes"] = wal_bytes
    return figures


def measure(count=200, repeat=7, sequential=50):
    limit = PhysicalLimit()
    try:
        durability = limit.durability()
        limit.per_commit(100)  # warm both paths: connections, prepared statements, caches
        recorded_run(50)
        statistics_kept = reset_statement_statistics()
        limits, costs, waits, statements, writes = [], [], [], [], []
        for _ in range(repeat):
            limits.append(limit.per_commit(count))
            cost, waited, sent, written = recorded_run(count)
            costs.append(cost)
            waits.append(waited)
            statements.append(sent)
            writes.append(written)
        server = server_costs() if statistics_kept else {}
    finally:
        limit.close()
    added = observability_costs()
    sequential_runs = [sequential_run() for _ in range(sequential)]
    figures = {
        "physical_limit_us": median(limits) * 1e6,
        "step_us": median(costs) * 1e6,
        "step_vs_limit": median(costs) / median(limits),
        "step_in_driver_us": median(waits) * 1e6,
        **{f"{variant}_added_us": seconds * 1e6 for variant, seconds in added.items()},
        **{f"{variant}_overhead": seconds / median(costs) for variant, seconds in added.items()},
        "run_statements": median(statements),
        "step_round_trips": (median(statements) - 2) / count,
        "steps_per_run": count,
        "sequential_5_step_run_ms": median(sequential_runs) * 1e3,
        "durability": durability,
        **server,
    }
    if writes[0] is not None:
        figures["step_write_transactions"] = (median(writes) - 1) / count
        figures["prepared_statements"] = prepared_statements()
    return figures
