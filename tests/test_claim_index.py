"""The claim reads an index without finished runs, whatever the backend."""

import datetime
import json
import uuid

import pytest
from django.db import connection, transaction
from django.utils import timezone

from everystep.db import claims
from everystep.models import Workflow

pytestmark = pytest.mark.django_db(transaction=True)

# What SQLite and MariaDB read per queue and priority (`claims._claim_in_steps`).
CLAIM_READ = (
    "SELECT id FROM everystep_workflow WHERE status = 'scheduled' AND queue = 'default' "
    "AND priority = 0 AND name IN ('w', 'v') AND run_at <= '2100-01-01' ORDER BY run_at LIMIT 8"
)


def plan(sql, params=None):
    explain = {"postgresql": "EXPLAIN ", "sqlite": "EXPLAIN QUERY PLAN ", "mysql": "EXPLAIN "}
    with connection.cursor() as cursor:
        cursor.execute(explain[connection.vendor] + sql, params)
        return " ".join(" ".join(map(str, row)) for row in cursor.fetchall())


def claim_plan():
    """The plan of the claim's read of due runs, as each backend makes it."""
    if connection.vendor != "postgresql":
        return plan(CLAIM_READ)
    params = {
        "every": True,
        "served": [],
        "workflows": ["w", "v"],
        "now": timezone.now(),
        "aged": timezone.now() - datetime.timedelta(minutes=5),
        "worker": "plan",
        "token": uuid.uuid4(),
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


# The claim's parameters, in the order PREPARE gives them numbers.
CLAIM_PARAMETERS = (
    ("every", "boolean"),
    ("served", "text[]"),
    ("workflows", "text[]"),
    ("now", "timestamptz"),
    ("aged", "timestamptz"),
    ("worker", "text"),
    ("token", "uuid"),
)


def rows_read(node):
    """The index entries and rows a plan node and its children read: the
    rows each returned, and those its filters removed, in every loop."""
    loops = node.get("Actual Loops", 1)
    own = (node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)) * loops
    return own + sum(rows_read(child) for child in node.get("Plans", []))


@pytest.mark.backends("postgres")
def test_the_generic_claim_reads_no_run_of_other_queues_and_none_due_later():
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
    statement = claims.CLAIM.format(limit=8)
    for number, (name, _) in enumerate(CLAIM_PARAMETERS, start=1):
        statement = statement.replace(f"%({name})s", f"${number}")
    types = ", ".join(kind for _, kind in CLAIM_PARAMETERS)
    now = timezone.now()
    aged = now - datetime.timedelta(minutes=5)
    # Written in: EXECUTE's arguments cannot be bound parameters.
    values = (
        "false",
        "ARRAY['default']",
        "ARRAY['w']",
        f"'{now.isoformat()}'",
        f"'{aged.isoformat()}'",
        "'t'",
        f"'{uuid.uuid4()}'",
    )
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor.execute(f"PREPARE generic_claim ({types}) AS {statement}")
        arguments = ", ".join(
            f"{value}::{kind}" for value, (_, kind) in zip(values, CLAIM_PARAMETERS, strict=True)
        )
        cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE generic_claim ({arguments})")
        [[plan]] = cursor.fetchall()
        cursor.execute("DEALLOCATE generic_claim")
        transaction.set_rollback(True)
    plan = plan[0] if isinstance(plan, list) else json.loads(plan)[0]
    assert plan["Plan"]["Actual Rows"] == 3  # the claim itself
    assert rows_read(plan["Plan"]) < 200, json.dumps(plan, indent=1)[:3000]


@pytest.mark.backends("sqlite", "mariadb")
def test_each_queue_and_priority_is_read_through_the_claim_index_up_to_now():
    """SQLite and MariaDB read each served queue and priority's due runs as
    a range of the claim index that stops at now: the 20,000 runs of
    another queue due now and the 20,000 due tomorrow are not read."""
    later = timezone.now() + datetime.timedelta(days=1)
    fill(
        {"name": "w", "run_at": later},
        *[Workflow(name="w", queue="other") for _ in range(20_000)],
        *[Workflow(name="w") for _ in range(3)],
    )
    now = timezone.now().strftime("%Y-%m-%d %H:%M:%S")
    claim_read = CLAIM_READ.replace("2100-01-01", now)
    read = plan(claim_read)
    if connection.vendor == "sqlite":
        assert "everystep_workflow_claim (queue=? AND priority=? AND run_at<?)" in read, read
    else:
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN " + claim_read)
            columns = [column[0] for column in cursor.description]
            [row] = [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]
        assert (row["key"], row["type"]) == ("everystep_workflow_claim", "range"), row
        assert int(row["rows"]) < 100, row
    assert len(claims.claim("ranged", 8, ["w"], ["default"])) == 3
