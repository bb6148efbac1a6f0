"""The runs list never reads the whole table: each filter's page seeks its
runs newest first through an index, without sorting them, whatever the
backend — except where the filter itself bounds the runs to a few (blocked
ones, one idempotency key), which a planner may fetch and sort; and the
queue's statuses are counted from the queue's own indexes. The times at
a million runs are in the benchmark (bench/ui.py)."""

import datetime

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from everystep import operations
from everystep.models import Workflow

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = 20_000


@pytest.fixture
def history():
    """20,000 runs, nearly all completed, of 20 workflows by 10 workers,
    with fresh planner statistics."""
    statuses = ["completed"] * 96 + ["failed", "failed", "stopped", "blocked"]
    Workflow.objects.bulk_create(
        [
            Workflow(
                name=f"app.flows.flow_{i % 20}",
                status=statuses[i % 100],
                claimed_by=f"worker-{i % 10}",
                idempotency_key=f"key-{i}" if i % 100 == 0 else None,
            )
            for i in range(RUNS)
        ],
        batch_size=2_000,
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "ANALYZE" if connection.vendor != "mysql" else "ANALYZE TABLE everystep_workflow"
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
        operations.runs_page(run_filter)
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
    "everything": (operations.RunFilter(), False),
    "failed": (operations.RunFilter(status="failed"), False),
    "one workflow": (operations.RunFilter(workflow="app.flows.flow_3"), False),
    "one worker": (operations.RunFilter(worker="worker-7"), False),
    "a time window": (
        operations.RunFilter(created_after=NOW - datetime.timedelta(days=1), created_before=NOW),
        False,
    ),
    "blocked": (operations.RunFilter(status="blocked"), True),
    "failed runs of one workflow": (
        operations.RunFilter(status="failed", workflow="app.flows.flow_1"),
        True,
    ),
    "an idempotency key": (operations.RunFilter(search="key-500"), True),
}


def test_each_filters_page_is_read_through_an_index(history):
    problems = {}
    for name, (run_filter, may_sort) in FILTERS.items():
        sql = page_query(run_filter)
        found = whole_table_or_sort(plan(sql), may_sort)
        if found:
            problems[name] = f"{found}: {sql}"
    assert problems == {}


@pytest.mark.backends("postgres", "mariadb")
def test_a_workflows_scheduled_runs_are_counted_from_the_queues_index(history):
    """Not on SQLite: with no histogram, its planner takes the workflow's
    index and reads all of the workflow's runs (a known cost there: about
    half a second for a workflow of 50,000 runs)."""
    run_filter = operations.RunFilter(workflow="app.flows.flow_3")
    with CaptureQueriesContext(connection) as queries:
        assert operations.status_counts(run_filter)["scheduled"] == 0
    [sql] = [query["sql"] for query in queries.captured_queries if "'scheduled'" in query["sql"]]
    text = " ".join(str(row) for row in plan(sql))
    assert "everystep_workflow_scheduled" in text, text
