"""The claim at scale: does a claim slow down as finished runs, or runs
waiting for a later time, pile up?

`claims.claim(name, 8)` is timed on an idle queue (nothing due) and with 8
runs scheduled, first with an empty table, then again after 1,000,000
terminal runs (status ``completed``) were bulk-loaded by ``INSERT …
SELECT`` statements that generate the rows in the database (100,000 a
statement) and the table ANALYZEd (and the load's dirty pages flushed: a
CHECKPOINT on PostgreSQL, so that its writes are not flushed under the
timed claims), and then again after 1,000,000 scheduled runs due tomorrow
and later (delayed starts, sleeps) were loaded the same way. Each figure is
the median of `samples` claims; the 8 runs are scheduled before and deleted
after each timed claim. Each ratio to the empty table should stay under
1.5. The suite measures every backend, and PostgreSQL also without
prepared statements (``?prepare_threshold=none``, as behind PgBouncer in
transaction mode), where every claim is planned afresh.
"""

import time

from django.db import connection, transaction

from bench import workflows
from bench.common import median
from bench.db import Dialect, analyze
from everystep import schedule
from everystep.db import claims
from everystep.models import Workflow

CHUNK = 100_000


def claim_latency(samples, waiting):
    """Median seconds of `claims.claim(…, 8)` with `waiting` runs scheduled."""
    timings = []
    for _ in range(samples):
        with transaction.atomic():
            ids = [schedule(workflows.one_step).id for _ in range(waiting)]
        began = time.perf_counter()
        claimed = claims.claim("bench-claims", 8)
        timings.append(time.perf_counter() - began)
        if len(claimed) != waiting:
            raise RuntimeError(f"claimed {len(claimed)} runs of {waiting} scheduled")
        if ids:
            Workflow.objects.filter(id__in=ids).delete()
    return median(timings)


def load_finished_runs(count):
    """Bulk-load `count` completed runs, created and due one a second
    before now, then ANALYZE."""
    _load(count, "completed", due_ms="{now} - i * 1000", created_ms="{now} - i * 1000", done=True)


def load_future_runs(count):
    """Bulk-load `count` scheduled runs due from tomorrow on, one a second,
    then ANALYZE."""
    _load(count, "scheduled", due_ms="{now} + 86400000 + i * 1000", created_ms="{now}", done=False)


def _load(count, status, due_ms, created_ms, done):
    sql = Dialect(connection.vendor)
    now = int(time.time() * 1000)
    due_ms, created_ms = due_ms.format(now=now), created_ms.format(now=now)
    # Random ids on PostgreSQL; elsewhere UUIDv7-shaped ones, unique by i
    # and their due time.
    run_id = "gen_random_uuid()" if sql.vendor == "postgresql" else sql.run_id(due_ms)
    completed = sql.moment(str(now)) if done else "NULL"
    args = sql.json("'[]'")
    with connection.cursor() as cursor:
        for first in range(1, count + 1, CHUNK):
            last = min(count, first + CHUNK - 1)
            with transaction.atomic():
                cursor.execute(
                    "INSERT INTO everystep_workflow "
                    "(id, name, args, status, created_at, run_at, completed_at) "
                    f"SELECT {run_id}, 'bench.workflows.one_step', {args}, '{status}', "
                    f"{sql.moment(created_ms)}, {sql.moment(due_ms)}, {completed} "
                    f"FROM {sql.numbers(first, last)}"
                )
    analyze("everystep_workflow")


def measure(samples=200, finished=1_000_000):
    claim_latency(20, 8)  # warm up
    empty_idle, empty_busy = claim_latency(samples, 0), claim_latency(samples, 8)
    began = time.perf_counter()
    load_finished_runs(finished)
    loaded = time.perf_counter() - began
    full_idle, full_busy = claim_latency(samples, 0), claim_latency(samples, 8)
    load_future_runs(finished)
    future_idle, future_busy = claim_latency(samples, 0), claim_latency(samples, 8)
    return {
        "finished_runs": finished,
        "load_seconds": loaded,
        "future_idle_us": future_idle * 1e6,
        "future_8_waiting_us": future_busy * 1e6,
        "ratio_future_idle": future_idle / empty_idle,
        "ratio_future_8_waiting": future_busy / empty_busy,
        "empty_idle_us": empty_idle * 1e6,
        "empty_8_waiting_us": empty_busy * 1e6,
        "full_idle_us": full_idle * 1e6,
        "full_8_waiting_us": full_busy * 1e6,
        "ratio_idle": full_idle / empty_idle,
        "ratio_8_waiting": full_busy / empty_busy,
    }
