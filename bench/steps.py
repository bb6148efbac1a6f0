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

The cost of observability: the same run with nothing subscribed to the
engine's events, with the metrics (`everystep.metrics`, as every worker has
them), with the spans too (`everystep.tracing`) on OpenTelemetry's no-op
tracer, and on the SDK recording into memory; interleaved repetition by
repetition.

Also here: a sequential 5-step run (schedule, claim and execute on one
thread) — the figure DBOS Transact's direct workflow call is compared with.
"""

import contextlib
import time

from django.db import connection
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from bench import workflows
from bench.common import RoundTrips, median
from bench.limits import PhysicalLimit
from everystep import events, metrics, runner, schedule, store, tracing


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


def observability_costs(count, repeat):
    """Median seconds per recorded step with nothing subscribed to the
    engine's events, with the metrics, with the metrics and the spans on
    OpenTelemetry's no-op tracer, and with both on the SDK recording into
    memory (each interleaved with the bare run it is compared to)."""
    metrics.install()
    tracing.install()
    both = (metrics.on_event, tracing.on_event)
    figures = {"bare": [], "metrics": [], "tracing_noop": [], "bare_again": [], "tracing_sdk": []}
    for _ in range(repeat):
        for variant, subscribed in (("bare", ()), ("metrics", both[:1]), ("tracing_noop", both)):
            with subscribers(subscribed):
                figures[variant].append(recorded_run(count)[0])
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    for _ in range(repeat):
        with subscribers(()):
            figures["bare_again"].append(recorded_run(count)[0])
        with subscribers(both):
            figures["tracing_sdk"].append(recorded_run(count)[0])
        exporter.clear()
    return {variant: median(values) for variant, values in figures.items()}


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
    costs_of = observability_costs(count, repeat)
    sequential_runs = [sequential_run() for _ in range(sequential)]
    figures = {
        "physical_limit_us": median(limits) * 1e6,
        "step_us": median(costs) * 1e6,
        "step_vs_limit": median(costs) / median(limits),
        "step_in_driver_us": median(waits) * 1e6,
        "step_without_subscribers_us": costs_of["bare"] * 1e6,
        "step_with_metrics_us": costs_of["metrics"] * 1e6,
        "metrics_overhead": costs_of["metrics"] / costs_of["bare"],
        "step_with_noop_tracing_us": costs_of["tracing_noop"] * 1e6,
        "noop_tracing_overhead": costs_of["tracing_noop"] / costs_of["bare"],
        "step_with_sdk_tracing_us": costs_of["tracing_sdk"] * 1e6,
        "sdk_tracing_overhead": costs_of["tracing_sdk"] / costs_of["bare_again"],
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
