"""The runs list never reads the whole table: each filter's page seeks its
runs newest first through an index, without sorting them, whatever the
backend — except where the filter itself bounds the runs to a few (blocked
ones, one idempotency key), which a planner may fetch and sort; and the
queue's statuses are counted from the queue's own indexes. The times at
a million runs are in the benchmark (bench/ui.py)."""

import datetime
import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from everystep.db import reads
from everystep.models import Event, Message, Step, Workflow

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = 20_000


@pytest.fixture
def history():
    """20,000 runs, nearly all completed, of 20 workflows by 10 workers,
    with fresh planner statistics."""
    fill_history(statistics=True)


def fill_history(statistics):
    statuses = ["completed"] * 96 + ["failed", "failed", "stopped", "blocked"]
    Workflow.objects.bulk_create(
        [
            Workflow(
                name=f"app.flows.flow_{i % 20}",
                status=statuses[i % 100],
                claimed_by=f"worker-{i % 10}",
                queue="emails" if i % 3 == 0 else "default",
                idempotency_key=f"key-{i}" if i % 100 == 0 else None,
            )
            for i in range(RUNS)
        ],
        batch_size=2_000,
    )
    if statistics:
        with connection.cursor() as cursor:
            cursor.execute(
                "ANALYZE" if connection.vendor != "mysql" else "ANALYZE TABLE everystep_workflow"
            )
    elif connection.vendor == "postgresql":
        # None at all: PostgreSQL keeps a table's statistics through the
        # TRUNCATE between tests, so an earlier test's (or autovacuum's,
        # after a large insert) would otherwise still guide the planner.
        with connection.cursor() as cursor:
            cursor.execute(
                "DELETE FROM pg_statistic WHERE starelid = 'everystep_workflow'::regclass"
            )
            cursor.execute(
                "UPDATE pg_class SET reltuples = -1, relpages = 0 "
                "WHERE oid = 'everystep_workflow'::regclass"
            )


def plan(sql):
    explain = {"postgresql": "EXPLAIN ", "sqlite": "EXPLAIN QUERY PLAN ", "mysql": "EXPLAIN "}
    with connection.cursor() as cursor:
        cursor.execute(explain[connection.vendor] + sql)
        columns = [column[0] for column in cursor.description]
        return [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]


def page_query(run_filter):
    """The SQL the runs page sends for its runs (not its counts)."""
    with CaptureQueriesContext(connection) as queries:
        reads.runs_page(run_filter)
    [query] = queries.captured_queries
    return query["sql"]


def whole_table_or_sort(rows, may_sort):
    """What in a plan reads the whole table, or sorts (unless `may_sort`)."""
    if connection.vendor == "postgresql":
        text = " ".join(str(row) for row in rows)
        found = [word for word in ("Seq Scan", "Sort") if word in text]
    elif connection.vendor == "mysql":
        found = [
            "filesort" if row["type"] != "ALL" else "whole table"
            for row in rows
            if row["type"] == "ALL" or "filesort" in (row["Extra"] or "")
        ]
    else:
        details = [row["detail"] for row in rows]
        found = [d for d in details if d == "SCAN everystep_workflow" or "TEMP B-TREE" in d]
    sorts = ("Sort", "filesort", "USE TEMP B-TREE FOR ORDER BY")
    return [what for what in found if not (may_sort and what in sorts)]


NOW = timezone.now()
# name: (filter, whether it bounds the runs to a few a planner may sort)
FILTERS = {
    "everything": (reads.RunFilter(), False),
    "failed": (reads.RunFilter(status="failed"), False),
    "one workflow": (reads.RunFilter(workflow="app.flows.flow_3"), False),
    "one worker": (reads.RunFilter(worker="worker-7"), False),
    "one queue": (reads.RunFilter(queue="emails"), False),
    "a time window": (
        reads.RunFilter(created_after=NOW - datetime.timedelta(days=1), created_before=NOW),
        False,
    ),
    "blocked": (reads.RunFilter(status="blocked"), True),
    "failed runs of one workflow": (
        reads.RunFilter(status="failed", workflow="app.flows.flow_1"),
        True,
    ),
    "an idempotency key": (reads.RunFilter(search="key-500"), True),
}


def test_each_filters_page_is_read_through_an_index(history):
    problems = {}
    for name, (run_filter, may_sort) in FILTERS.items():
        sql = page_query(run_filter)
        found = whole_table_or_sort(plan(sql), may_sort)
        if found:
            problems[name] = f"{found}: {sql}"
    assert problems == {}


def count_queries(run_filter):
    """``{status: (count, SQL)}`` of the runs page's counts per status."""
    with CaptureQueriesContext(connection) as queries:
        counts = reads.status_counts(run_filter)
    sqls = [query["sql"] for query in queries.captured_queries]
    return dict(zip(reads.STATUSES, zip(counts.values(), sqls, strict=True), strict=True))


def reads_all(rows):
    """What in a plan reads a whole table, or a whole index of runs of
    every status: a count must read only the runs of its status."""
    if connection.vendor == "postgresql":
        return [word for word in ("Seq Scan",) if word in " ".join(str(row) for row in rows)]
    if connection.vendor == "mysql":
        return [
            f"{row['type']} {row['key']}"
            for row in rows
            if row["table"] == "everystep_workflow" and row["type"] in ("ALL", "index")
        ]
    return [row["detail"] for row in rows if not reads_by_status_on_sqlite(row["detail"])]


def reads_by_status_on_sqlite(detail):
    """Whether a step of SQLite's plan reads runs of one status only, or
    none but those a run id or idempotency key names."""
    if not detail.startswith(("SCAN everystep_workflow", "SEARCH everystep_workflow")):
        return True
    found = re.search(r"USING (?:COVERING )?INDEX (\S+)(?: \((.*)\))?", detail)
    if found is None:
        return False
    index, terms = found.group(1), found.group(2) or ""
    return index in ONE_STATUS_INDEXES or terms.startswith(("status=", "id", "idempotency_key="))


# SQLite's partial indexes (migrations 0002–0008), each of the runs of one
# status: read whole, they still hold that status's runs alone.
ONE_STATUS_INDEXES = (
    "everystep_workflow_scheduled",
    "everystep_workflow_claim",
    "everystep_workflow_claimed_by",
    "everystep_workflow_blocked",
    *(
        f"everystep_run_{status}{index}"
        for status in ("completed", "failed", "stopped", "cancelled")
        for index in ("", "_name", "_worker")
    ),
)


@pytest.mark.parametrize("statistics", ["gathered", "none"])
def test_each_filters_counts_read_only_the_runs_of_each_status(statistics):
    """Counted per status, under every filter, from an index led by the
    status: never a whole table or index (but for a count that stops at the
    cap), whether the planner has
    statistics or not (SQLite keeps none until ANALYZE, and the fixture's
    statistics see no scheduled or running runs, as on a quiet day)."""
    fill_history(statistics=statistics == "gathered")
    problems = {}
    for name, (run_filter, _) in FILTERS.items():
        for status, (count, sql) in count_queries(run_filter).items():
            found = reads_all(plan(sql))
            # A count that reaches the cap stops there, however it reads.
            if found and count <= reads.COUNT_CAP:
                problems.setdefault(name, []).append(f"{status} {found}: {sql}")
    assert problems == {}


def test_a_prune_batch_reads_the_runs_that_ended_first_through_an_index():
    """Retention takes the runs that ended before a time, oldest first, a
    batch at a time: each batch seeks them through the index of end times
    (migration 0016) and counts each one's steps, messages and events
    through their own indexes; it never reads a table, never sorts."""
    from everystep.db import retention

    ended = timezone.now() - datetime.timedelta(days=60)
    statuses = ["completed"] * 96 + ["failed", "failed", "stopped", "blocked"]
    runs = Workflow.objects.bulk_create(
        [
            Workflow(
                name=f"app.flows.flow_{i % 20}",
                status=statuses[i % 100],
                completed_at=ended + datetime.timedelta(seconds=i),
            )
            for i in range(RUNS)
        ],
        batch_size=2_000,
    )
    Workflow.objects.bulk_create([Workflow(name="app.flows.flow_1") for _ in range(RUNS // 10)])
    Step.objects.bulk_create(
        [Step(workflow=run, step_id="1", name="app.flows.work", status="done") for run in runs],
        batch_size=2_000,
    )
    some = runs[::10]  # a tenth of the runs have a message and an event
    Message.objects.bulk_create(Message(workflow=run, topic="go", payload=1) for run in some)
    Event.objects.bulk_create(Event(workflow=run, key="progress", value=1) for run in some)
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            tables = ("workflow", "step", "message", "event")
            cursor.execute("ANALYZE TABLE " + ", ".join(f"everystep_{t}" for t in tables))
        else:
            cursor.execute("ANALYZE")
    before = ended + datetime.timedelta(seconds=RUNS // 2)
    with CaptureQueriesContext(connection) as queries:
        assert retention.delete_batch(before, ["completed", "stopped", "cancelled"]) > 0
    [selected] = [q["sql"] for q in queries.captured_queries if "completed_at" in q["sql"]][:1]
    assert whole_table_or_sort(plan(selected), may_sort=False) == [], plan(selected)
