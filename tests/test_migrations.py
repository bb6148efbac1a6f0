"""The migrations leave the schema the engine's queries are written for:
every index, including those each backend gets its own way, and nothing
the models declare that no migration made."""

import io
import uuid

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from everystep.db import claims

pytestmark = pytest.mark.django_db(transaction=True)

FINISHED = ("completed", "failed", "stopped", "cancelled")
PARTIAL = {
    "everystep_workflow_scheduled",
    "everystep_workflow_claimed_by",
    "everystep_workflow_blocked",
    *(f"everystep_run_{status}" for status in FINISHED),
    *(f"everystep_run_{status}_{by}" for status in FINISHED for by in ("name", "worker")),
}
EXPECTED = {
    "postgresql": PARTIAL,
    "sqlite": PARTIAL,
    "mysql": {
        "everystep_workflow_scheduled",
        "everystep_workflow_claimed_by",
        "everystep_run_status",
        "everystep_run_status_name",
        "everystep_run_status_worker",
    },
}
EVERY_BACKEND = {
    "everystep_run_name",
    "everystep_run_worker",
    "everystep_run_key",
    "everystep_run_queue",
    "everystep_workflow_claim",
    "everystep_workflow_queue_status",
    "everystep_workflow_started",
}


def test_every_index_of_every_migration_is_in_place():
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, "everystep_workflow")
    missing = (EXPECTED[connection.vendor] | EVERY_BACKEND) - set(constraints)
    assert missing == set()


def test_the_claim_index_leads_with_the_due_time():
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, "everystep_workflow")
    columns = constraints["everystep_workflow_scheduled"]["columns"]
    expected = ["status", "run_at", "name"] if connection.vendor == "mysql" else ["run_at", "name"]
    assert columns == expected


def test_the_models_need_no_migration_that_is_not_written():
    out = io.StringIO()
    call_command("makemigrations", "everystep", "--check", "--dry-run", stdout=out)


def test_a_run_inserted_without_a_due_time_is_due_at_once():
    """What a process of the previous version inserts during a rolling
    deploy: no run_at. The database makes it due now (on SQLite, due since
    long ago), so it is claimed as before."""
    run_id = uuid.uuid4()
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO everystep_workflow (id, name, args, status, created_at) "
            "VALUES (%s, 'tests.workflows.quick', '[1]', 'scheduled', %s)",
            [
                str(run_id) if connection.vendor == "postgresql" else run_id.hex,
                connection.ops.adapt_datetimefield_value(timezone.now()),
            ],
        )
    [claimed] = claims.claim("tests", 1, ["tests.workflows.quick"])
    assert claimed.fence.run_id == run_id
