"""The claim at scale: does a claim slow down as finished runs, runs
parked in a wait, or runs waiting for a later time, pile up?

`claims.claim(name, 8)` is timed on an idle queue (nothing due) and with 8
runs scheduled, first with an empty table, then beside 10,000 runs parked
waiting for a message (``receive()`` without a timeout: scheduled, due in
the year 9999, then removed), then again after 1,000,000 terminal runs
(status ``completed``) were bulk-loaded by ``INSERT … SELECT`` statements
that generate the rows in the database (100,000 a statement) and the table
ANALYZEd (and the load's dirty pages flushed: a CHECKPOINT on PostgreSQL,
so that its writes are not flushed under the timed claims), and then again
after 1,000,000 scheduled runs due tomorrow and later (delayed starts,
sleeps) were loaded the same way. Then, in that table, with limits: the
default queue gets a concurrency limit too high to hold anything back, so
that each claim locks its row and counts its running runs (the ratio is to
the same claim without limits). Last, 1,000,000 runs of another queue, due
now, are loaded, and the claim of a worker serving only the default queue
is timed. Each figure is the median of `samples` claims; the 8 runs are
scheduled before and deleted after each timed claim. Beside the finished
runs, the claims are timed again after `churned` more runs were
scheduled, claimed 8 at a time and deleted, as a busy queue does between
two vacuums of the table (autovacuum held off meanwhile on PostgreSQL, so
that the figure does not depend on when it would have come by). Each ratio
should stay under 1.5: that of the finished runs to the empty table; that
of the claims after the churned runs to those before them; those
of the runs scheduled for later (parked, due tomorrow) and of another
queue's to the table holding one run due tomorrow. On SQLite and MariaDB a
claim that knows a (queue, priority) pair reads its due runs, and one that
knows none does not (the module `everystep.db.claims` says why): a single
run due later makes the first claim that kind, so against it a ratio
measures the pile alone. The baseline of a queue without limits is the
claim everystep made before it had queues (`BASELINE`, timed on the empty
table in this same run): the ratio of today's claim to it should stay
near 1. The suite measures every backend, and PostgreSQL also without
prepared statements (``?prepare_threshold=none``, as behind PgBouncer in
transaction mode), where every claim is planned afresh."""

import time
import uuid

from django.db import connection, transaction

from bench import workflows
from bench.common import median
from bench.db import Dialect, analyze, autovacuum_off
from everystep import schedule
from everystep.core import clock, registry
from everystep.core.queues import Queue
from everystep.db import claims
from everystep.db import queues as queue_rows
from everystep.models import Queue as QueueRow
from everystep.models import Workflow

CHUNK = 100_000


# The claim before queues, the baseline, as everystep made it then: on
# PostgreSQL one statement through Django's cursor, the due runs in due
# order whatever their queue or priority, read back as `ClaimedRun`s;
# elsewhere a locking read of them through the ORM, then an update
# (`claims._lock_and_take`).
BASELINE = """
    UPDATE everystep_workflow
       SET status = 'running', claimed_by = %s, claim_token = %s, claimed_at = %s
     WHERE id = ANY(ARRAY(SELECT id FROM everystep_workflow
                           WHERE status = 'scheduled' AND name = ANY(%s) AND run_at <= %s
                           ORDER BY run_at LIMIT 8
                           FOR UPDATE SKIP LOCKED))
 RETURNING id, name, args, run_at, trace_context, cancel_requested_at IS NOT NULL,
           EXISTS (SELECT 1 FROM everystep_step s WHERE s.workflow_id = everystep_workflow.id)
"""


def baseline_claim(worker, limit):
    """Claim as everystep did before queues; returns how many runs."""
    names, token, now = registry.names(), uuid.uuid4(), clock.now()
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(BASELINE, [worker, token, now, names, now])
            rows = cursor.fetchall()
        return len(claims.claimed_from_returning(rows, worker, token))
    due = Workflow.objects.filter(status="scheduled", name__in=names, run_at__lte=now)
    return len(claims._lock_and_take(due, limit, worker, token, now))


def claim_latency(samples, waiting, served=None, claim=None):
    """Median seconds of `claims.claim(…, 8)` of the `served` queues (all
    if None) with `waiting` runs scheduled in the default queue."""
    timings = []
    for _ in range(samples):
        with transaction.atomic():
            ids = [schedule(workflows.one_step).id for _ in range(waiting)]
        began = time.perf_counter()
        if claim is None:
            claimed = len(claims.claim("bench-claims", 8, served=served))
        else:
            claimed = claim("bench-claims", 8)
        timings.append(time.perf_counter() - began)
        if claimed != waiting:
            raise RuntimeError(f"claimed {claimed} runs of {waiting} scheduled")
        if ids:
            Workflow.objects.filter(id__in=ids).delete()
    return median(timings)


def load_finished_runs(count):
    """Bulk-load `count` completed runs, created and due one a second
    before now, then ANALYZE."""
    load_runs(
        count, "completed", due_ms="{now} - i * 1000", created_ms="{now} - i * 1000", done=True
    )


def load_future_runs(count):
    """Bulk-load `count` scheduled runs due from tomorrow on, one a second,
    then ANALYZE."""
    load_runs(
        count, "scheduled", due_ms="{now} + 86400000 + i * 1000", created_ms="{now}", done=False
    )


PARKED = 10_000
#: The due time of a wait without a timeout (`everystep.core.clock.FOREVER`).
FOREVER_MS = int(clock.FOREVER.timestamp() * 1000)


def remove_future_runs():
    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM everystep_workflow WHERE status = 'scheduled' AND run_at > %s",
            [clock.now()],
        )
    analyze("everystep_workflow", vacuum=True)


def load_parked_runs(count):
    """Bulk-load `count` runs parked in a ``receive("payment")`` without a
    timeout, then ANALYZE."""
    load_runs(
        count,
        "scheduled",
        due_ms=str(FOREVER_MS),
        created_ms="{now}",
        done=False,
        wait_topic="payment",
    )


def remove_parked_runs():
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM everystep_workflow WHERE wait_topic = 'payment'")
    analyze("everystep_workflow", vacuum=True)


def load_other_queue_runs(count):
    """Bulk-load `count` scheduled runs of the queue ``other``, due one a
    second before now, then ANALYZE."""
    load_runs(
        count,
        "scheduled",
        due_ms="{now} - i * 1000",
        created_ms="{now} - i * 1000",
        done=False,
        queue="other",
    )


def load_runs(
    count, status, due_ms, created_ms, done, queue="default", wait_topic=None, ended_ms="{now}"
):
    """Bulk-load `count` runs in `status`, their times computed from their
    number ``i`` and ``{now}`` (milliseconds); ended (at `ended_ms`) if
    `done`. Then ANALYZE."""
    sql = Dialect(connection.vendor)
    now = int(time.time() * 1000)
    due_ms, created_ms = due_ms.format(now=now), created_ms.format(now=now)
    # Random ids on PostgreSQL; elsewhere UUIDv7-shaped ones, unique by i
    # and their due time.
    run_id = "gen_random_uuid()" if sql.vendor == "postgresql" else sql.run_id(due_ms)
    completed = sql.moment(ended_ms.format(now=now)) if done else "NULL"
    args = sql.json("'[]'")
    topic = "NULL" if wait_topic is None else f"'{wait_topic}'"
    with connection.cursor() as cursor:
        for first in range(1, count + 1, CHUNK):
            last = min(count, first + CHUNK - 1)
            with transaction.atomic():
                cursor.execute(
                    "INSERT INTO everystep_workflow "
                    "(id, name, args, status, created_at, run_at, completed_at, queue, wait_topic) "
                    f"SELECT {run_id}, 'bench.workflows.one_step', {args}, '{status}', "
                    f"{sql.moment(created_ms)}, {sql.moment(due_ms)}, {completed}, '{queue}', "
                    f"{topic} "
                    f"FROM {sql.numbers(first, last)}"
                )
    # Vacuumed too: otherwise autovacuum takes up the million new rows
    # while the next claims are timed.
    analyze("everystep_workflow", vacuum=True)


def measure(samples=200, finished=1_000_000, churned=20_000):
    claim_latency(20, 8)  # warm up
    empty_idle, empty_busy = claim_latency(samples, 0), claim_latency(samples, 8)
    claim_latency(20, 8, claim=baseline_claim)  # warm up
    baseline_idle = claim_latency(samples, 0, claim=baseline_claim)
    baseline_busy = claim_latency(samples, 8, claim=baseline_claim)
    load_future_runs(1)
    lone_idle, lone_busy = claim_latency(samples, 0), claim_latency(samples, 8)
    remove_future_runs()
    load_parked_runs(PARKED)
    parked_idle, parked_busy = claim_latency(samples, 0), claim_latency(samples, 8)
    remove_parked_runs()
    began = time.perf_counter()
    load_finished_runs(finished)
    loaded = time.perf_counter() - began
    full_idle, full_busy = claim_latency(samples, 0), claim_latency(samples, 8)
    with autovacuum_off("everystep_workflow"):
        claim_latency(churned // 8, 8)
        churned_idle, churned_busy = claim_latency(samples, 0), claim_latency(samples, 8)
    load_future_runs(finished)  # and VACUUM
    future_idle, future_busy = claim_latency(samples, 0), claim_latency(samples, 8)
    queue_rows.declare([Queue("default", concurrency=1_000_000)])
    limited_idle, limited_busy = claim_latency(samples, 0), claim_latency(samples, 8)
    QueueRow.objects.filter(name="default").delete()
    claims.forget_limits()
    load_other_queue_runs(finished)
    only_default = ["default"]
    other_idle = claim_latency(samples, 0, only_default)
    other_busy = claim_latency(samples, 8, only_default)
    return {
        "parked_runs": PARKED,
        "parked_idle_us": parked_idle * 1e6,
        "parked_8_waiting_us": parked_busy * 1e6,
        "ratio_parked_idle": parked_idle / lone_idle,
        "ratio_parked_8_waiting": parked_busy / lone_busy,
        "baseline_idle_us": baseline_idle * 1e6,
        "baseline_8_waiting_us": baseline_busy * 1e6,
        "ratio_baseline_idle": empty_idle / baseline_idle,
        "ratio_baseline_8_waiting": empty_busy / baseline_busy,
        "limited_idle_us": limited_idle * 1e6,
        "limited_8_waiting_us": limited_busy * 1e6,
        "ratio_limited_idle": limited_idle / future_idle,
        "ratio_limited_8_waiting": limited_busy / future_busy,
        "other_queue_idle_us": other_idle * 1e6,
        "other_queue_8_waiting_us": other_busy * 1e6,
        "ratio_other_queue_idle": other_idle / lone_idle,
        "ratio_other_queue_8_waiting": other_busy / lone_busy,
        "finished_runs": finished,
        "load_seconds": loaded,
        "future_idle_us": future_idle * 1e6,
        "future_8_waiting_us": future_busy * 1e6,
        "ratio_future_idle": future_idle / lone_idle,
        "ratio_future_8_waiting": future_busy / lone_busy,
        "churned_runs": churned,
        "churned_idle_us": churned_idle * 1e6,
        "churned_8_waiting_us": churned_busy * 1e6,
        "ratio_churned_idle": churned_idle / full_idle,
        "ratio_churned_8_waiting": churned_busy / full_busy,
        "lone_idle_us": lone_idle * 1e6,
        "lone_8_waiting_us": lone_busy * 1e6,
        "empty_idle_us": empty_idle * 1e6,
        "empty_8_waiting_us": empty_busy * 1e6,
        "full_idle_us": full_idle * 1e6,
        "full_8_waiting_us": full_busy * 1e6,
        "ratio_idle": full_idle / empty_idle,
        "ratio_8_waiting": full_busy / empty_busy,
    }
