"""The claim reads an index without finished runs, whatever the backend."""

import datetime
import json
import re
import uuid

import pytest
from django.db import connection, transaction
from django.utils import timezone

from everystep.db import claims
from everystep.models import Workflow

pytestmark = pytest.mark.django_db(transaction=True)


def plan(sql, params=None):
    explain = {"postgresql": "EXPLAIN ", "sqlite": "EXPLAIN QUERY PLAN ", "mysql": "EXPLAIN "}
    with connection.cursor() as cursor:
        cursor.execute(explain[connection.vendor] + sql, params)
        return " ".join(" ".join(map(str, row)) for row in cursor.fetchall())


def due_statement(served=None):
    """SQLite's and MariaDB's read of the due runs and the pair seeks
    (`claims._read_due`), for the pairs a claim has just found."""
    claims.claim("pairs", 1, ["no such workflow"], served)
    chains = [None] if served is None else served
    members = {chain: claims._members(claims._known_pairs(), chain) for chain in chains}
    return claims.due_statement(chains, members, {}, ["w", "v"], timezone.now(), 8)


def claim_plan():
    """The plan of the claim's read of due runs, as each backend makes it."""
    if connection.vendor != "postgresql":
        return plan(*due_statement())
    params = {
        "every": True,
        "served": [],
        "workflows": ["w", "v"],
        "now": timezone.now(),
        "aged": timezone.now() - datetime.timedelta(minutes=5),
        "worker": "plan",
        "token": uuid.uuid4(),
        "own_commit": True,
    }
    return plan(claims.CLAIM.format(limit=8), params)


def fill(finished, *others):
    """Insert 20,000 copies of the `finished` run, then the `others`, and
    refresh the planner's statistics."""
    Workflow.objects.bulk_create(
        [Workflow(**finished) for _ in range(20_000)] + list(others), batch_size=2_000
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "ANALYZE" if connection.vendor != "mysql" else "ANALYZE TABLE everystep_workflow"
        )


def test_the_claim_seeks_through_the_scheduled_index_past_many_finished_runs():
    fill({"name": "w", "status": "completed"}, *[Workflow(name="w") for _ in range(5)])
    assert "everystep_workflow_claim" in claim_plan()
    assert "Seq Scan on everystep_workflow" not in claim_plan()
    assert len(claims.claim("indexed", 8, ["w", "v"])) == 5


def test_the_catchup_reads_an_index_of_running_runs_by_name():
    fill(
        {"name": "w", "status": "completed", "claimed_by": "old"},
        Workflow(name="w", status="running", claimed_by="w-0"),
    )
    catchup = (
        "SELECT id FROM everystep_workflow WHERE status = 'running' AND claimed_by = 'w-0' "
        "AND name IN ('w')"
    )
    assert "everystep_workflow_claimed_by" in plan(catchup)
    assert len(claims.claim("w-0", 8, ["w"], only_parked=True)) == 1


@pytest.mark.backends("postgres")
def test_a_prepared_claim_keeps_its_generic_plan_with_many_runs_due_later():
    """Runs waiting for a later time do not make PostgreSQL plan every
    claim afresh: the prepared claim's generic plan is the one it runs."""
    later = timezone.now() + datetime.timedelta(days=1)
    fill({"name": "w", "run_at": later}, Workflow(name="w"))
    assert len(claims.claim("generic", 8, ["w"])) == 1
    for _ in range(12):  # prepared on the 5th, generic plan from the 6th run on
        assert claims.claim("generic", 8, ["w"]) == []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT generic_plans FROM pg_prepared_statements "
            "WHERE statement LIKE '%%SKIP LOCKED%%'"
        )
        (generic_plans,) = cursor.fetchone()
    assert generic_plans > 0


# The types of the claim's parameters, for PREPARE.
CLAIM_TYPES = {
    "every": "boolean",
    "served": "varchar[]",
    "workflows": "text[]",
    "now": "timestamptz",
    "aged": "timestamptz",
    "worker": "text",
    "token": "uuid",
    "own_commit": "boolean",
}


def rows_read(node):
    """The index entries and rows a plan node and its children read: the
    rows each returned, and those its filters removed, in every loop."""
    loops = node.get("Actual Loops", 1)
    own = (node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)) * loops
    return own + sum(rows_read(child) for child in node.get("Plans", []))


@pytest.mark.backends("postgres")
@pytest.mark.parametrize("claim_sql", ["CLAIM", "CLAIM_UNLIMITED"])
def test_the_generic_claim_reads_no_run_of_other_queues_and_none_due_later(claim_sql):
    """With 20,000 runs of another queue due now and 20,000 of the default
    queue due tomorrow, a worker serving the default queue claims its 3 due
    runs through the prepared claim's generic plan (the one it runs) while
    reading a few dozen rows, not thousands."""
    later = timezone.now() + datetime.timedelta(days=1)
    Workflow.objects.bulk_create(
        [Workflow(name="w", run_at=later) for _ in range(20_000)]
        + [Workflow(name="w", queue="other") for _ in range(20_000)]
        + [Workflow(name="w") for _ in range(3)],
        batch_size=2_000,
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE everystep_workflow")
    statement = getattr(claims, claim_sql).format(limit=8)
    names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", statement)))
    for number, name in enumerate(names, start=1):
        statement = statement.replace(f"%({name})s", f"${number}")
    types = ", ".join(CLAIM_TYPES[name] for name in names)
    now = timezone.now()
    aged = now - datetime.timedelta(minutes=5)
    # Written in: EXECUTE's arguments cannot be bound parameters.
    written = {
        "every": "false",
        "served": "ARRAY['default']",
        "workflows": "ARRAY['w']",
        "now": f"'{now.isoformat()}'",
        "aged": f"'{aged.isoformat()}'",
        "worker": "'t'",
        "token": f"'{uuid.uuid4()}'",
        "own_commit": "true",
    }
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor.execute(f"PREPARE generic_claim ({types}) AS {statement}")
        arguments = ", ".join(f"{written[name]}::{CLAIM_TYPES[name]}" for name in names)
        cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE generic_claim ({arguments})")
        [[plan]] = cursor.fetchall()
        cursor.execute("DEALLOCATE generic_claim")
        transaction.set_rollback(True)
    plan = plan[0] if isinstance(plan, list) else json.loads(plan)[0]
    assert plan["Plan"]["Actual Rows"] == 3  # the claim itself
    assert rows_read(plan["Plan"]) < 200, json.dumps(plan, indent=1)[:3000]


@pytest.mark.backends("sqlite", "mariadb")
@pytest.mark.parametrize("served", [None, ["default"]], ids=["every queue", "one queue"])
def test_each_queue_and_priority_is_read_through_the_claim_index_up_to_now(served):
    """SQLite and MariaDB read the due runs of each queue and priority, and
    seek the pairs, through the claim's indexes, in ranges that stop after
    a few rows: the 20,000 runs of another queue due now and the 20,000 due
    tomorrow are not read."""
    later = timezone.now() + datetime.timedelta(days=1)
    fill(
        {"name": "w", "run_at": later},
        *[Workflow(name="w", queue="other") for _ in range(20_000)],
        *[Workflow(name="w") for _ in range(3)],
    )
    sql, params = due_statement(served)
    if connection.vendor == "sqlite":
        read = plan(sql, params)
        assert "SCAN w" not in read and "SCAN everystep_workflow" not in read, read
        runs = "SEARCH w USING INDEX everystep_workflow_claim (queue=? AND priority=? AND run_at<?)"
        assert read.count(runs) == (2 if served is None else 1), read
    else:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("ANALYZE " + sql, params)  # runs it: r_rows are the rows read
            columns = [column[0] for column in cursor.description]
            rows = [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]
            transaction.set_rollback(True)
        reads = [row for row in rows if row["table"] == "w"]
        assert all(row["type"] in ("range", "ref") for row in reads), rows
        assert sum(float(row["r_rows"] or 0) for row in reads) < 100, rows
        runs = [row for row in reads if row["key"] == "everystep_workflow_claim"]
        assert len(runs) == (2 if served is None else 1), rows
    claimed = claims.claim("ranged", 8, ["w"], served)
    assert len(claimed) == (8 if served is None else 3)
