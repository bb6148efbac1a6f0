"""Indexes that let the queue gauges count without reading finished runs.

The metrics count the runs scheduled (by workflow, with the oldest one's
age), running and blocked at most every few seconds. Each count must cost
what the queue holds, never the history: a million finished runs must not
be read. On PostgreSQL and SQLite the claim index of scheduled runs also
carries the workflow name, so counting them by workflow reads the index
alone, and blocked runs get a partial index of their own (running runs have
one already, the take-back's). On MariaDB/MySQL the claim index, led by the
status, gains the name and serves all three counts.
"""

from django.db import migrations

from everystep.migrations._per_backend import run_for_backend

DROP_SCHEDULED = "DROP INDEX IF EXISTS everystep_workflow_scheduled"
PARTIAL_SCHEDULED = (
    "CREATE INDEX IF NOT EXISTS everystep_workflow_scheduled ON everystep_workflow (created_at) "
    "WHERE status = 'scheduled'"
)
PARTIAL_SCHEDULED_BY_NAME = (
    "CREATE INDEX IF NOT EXISTS everystep_workflow_scheduled "
    "ON everystep_workflow (created_at, name) WHERE status = 'scheduled'"
)
PARTIAL_BLOCKED = (
    "CREATE INDEX IF NOT EXISTS everystep_workflow_blocked ON everystep_workflow (created_at) "
    "WHERE status = 'blocked'"
)
DROP_BLOCKED = "DROP INDEX IF EXISTS everystep_workflow_blocked"
# One statement each way on MariaDB/MySQL: the claim index is never missing.
MYSQL_ADD_NAME = (
    "ALTER TABLE everystep_workflow DROP INDEX everystep_workflow_scheduled, "
    "ADD INDEX everystep_workflow_scheduled (status, created_at, name)"
)
MYSQL_DROP_NAME = (
    "ALTER TABLE everystep_workflow DROP INDEX everystep_workflow_scheduled, "
    "ADD INDEX everystep_workflow_scheduled (status, created_at)"
)

# On PostgreSQL and SQLite, each statement can run again after a failure.
FORWARD = {
    "postgresql": [DROP_SCHEDULED, PARTIAL_SCHEDULED_BY_NAME, PARTIAL_BLOCKED],
    "sqlite": [DROP_SCHEDULED, PARTIAL_SCHEDULED_BY_NAME, PARTIAL_BLOCKED],
    "mysql": [MYSQL_ADD_NAME],
}
BACKWARD = {
    "postgresql": [DROP_BLOCKED, DROP_SCHEDULED, PARTIAL_SCHEDULED],
    "sqlite": [DROP_BLOCKED, DROP_SCHEDULED, PARTIAL_SCHEDULED],
    "mysql": [MYSQL_DROP_NAME],
}


class Migration(migrations.Migration):
    dependencies = [("everystep", "0004_worker")]

    operations = [
        # Not atomic: MariaDB cannot run DDL inside a transaction.
        migrations.RunPython(
            run_for_backend(FORWARD), run_for_backend(BACKWARD), atomic=False, elidable=False
        )
    ]
