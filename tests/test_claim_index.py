"""The claim reads an index without finished runs, whatever the backend."""

import datetime
import uuid

import pytest
from django.db import connection
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
