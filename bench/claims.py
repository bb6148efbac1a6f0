"""The claim at scale: does a claim slow down as finished runs, or runs
waiting for a later time, pile up?

`store.claim(name, 8)` is timed on an idle queue (nothing due) and with 8
runs scheduled, first with an empty table, then again after 1,000,000
terminal runs (status ``completed``) were bulk-loaded with one ``INSERT …
SELECT generate_series`` and the table ANALYZEd (and a CHECKPOINT taken, so
that the load's writes are not flushed under the timed claims), and then
again after 1,000,000 scheduled runs due tomorrow and later (delayed
starts, sleeps) were loaded the same way. Each figure is the median of
`samples` claims; the 8 runs are scheduled before and deleted after each
timed claim. Each ratio to the empty table should stay under 1.5.
"""

import time

from django.db import connection, transaction

from bench import workflows
from bench.common import median
from everystep import schedule, store
from everystep.models import Workflow


def claim_latency(samples, waiting):
    """Median seconds of `store.claim(…, 8)` with `waiting` runs scheduled."""
    timings = []
    for _ in range(samples):
        with transaction.atomic():
            ids = [schedule(workflows.one_step).id for _ in range(waiting)]
        began = time.perf_counter()
        claimed = store.claim("bench-claims", 8)
        timings.append(time.perf_counter() - began)
        if len(claimed) != waiting:
            raise RuntimeError(f"claimed {len(claimed)} runs of {waiting} scheduled")
        if ids:
            Workflow.objects.filter(id__in=ids).delete()
    return median(timings)


def load_finished_runs(count):
    """Bulk-load `count` completed runs in one statement, then ANALYZE
    (PostgreSQL only)."""
    _load(
        count,
        "SELECT gen_random_uuid(), 'bench.workflows.one_step', '[]', 'completed', "
        "now() - make_interval(secs => g), now() - make_interval(secs => g), now() "
        "FROM generate_series(1, %s) g",
    )


def load_future_runs(count):
    """Bulk-load `count` scheduled runs due from tomorrow on, one a second,
    in one statement, then ANALYZE (PostgreSQL only)."""
    _load(
        count,
        "SELECT gen_random_uuid(), 'bench.workflows.one_step', '[]', 'scheduled', "
        "now(), now() + interval '1 day' + make_interval(secs => g), NULL "
        "FROM generate_series(1, %s) g",
    )


def _load(count, select):
    if connection.vendor != "postgresql":
        raise NotImplementedError(
            f"the bulk load is written for PostgreSQL, not {connection.vendor}"
        )
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO everystep_workflow "
            "(id, name, args, status, created_at, run_at, completed_at) " + select,
            [count],
        )
        cursor.execute("ANALYZE everystep_workflow")
        # Flush the load's dirty pages now, not under the claims timed next.
        cursor.execute("CHECKPOINT")


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
