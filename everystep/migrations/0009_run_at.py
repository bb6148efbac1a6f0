"""The due time of a run, ``run_at``: one "not before" rule for delayed
starts, durable sleeps and retry waits.

Existing runs become due when they were created, so the scheduled ones keep
their order. The claim index moves from the creation time to the due time,
with the workflow name still in it: a claim reads the due runs in order and
stops at the first one not yet due, however many wait for later. On
PostgreSQL the notification of a scheduled run now carries its due time
(Unix seconds), so that an idle worker can wake for it.
"""

from django.db import migrations, models
from django.utils import timezone

from everystep.migrations._per_backend import run_for_backend

CLAIM_INDEX = {
    "postgresql": [
        "DROP INDEX IF EXISTS everystep_workflow_scheduled",
        "CREATE INDEX everystep_workflow_scheduled ON everystep_workflow (run_at, name) "
        "WHERE status = 'scheduled'",
    ],
    "sqlite": [
        "DROP INDEX IF EXISTS everystep_workflow_scheduled",
        "CREATE INDEX everystep_workflow_scheduled ON everystep_workflow (run_at, name) "
        "WHERE status = 'scheduled'",
    ],
    "mysql": [
        "ALTER TABLE everystep_workflow DROP INDEX everystep_workflow_scheduled, "
        "ADD INDEX everystep_workflow_scheduled (status, run_at, name)"
    ],
}
CREATION_INDEX = {
    "postgresql": [
        "DROP INDEX IF EXISTS everystep_workflow_scheduled",
        "CREATE INDEX everystep_workflow_scheduled ON everystep_workflow (created_at, name) "
        "WHERE status = 'scheduled'",
    ],
    "sqlite": [
        "DROP INDEX IF EXISTS everystep_workflow_scheduled",
        "CREATE INDEX everystep_workflow_scheduled ON everystep_workflow (created_at, name) "
        "WHERE status = 'scheduled'",
    ],
    "mysql": [
        "ALTER TABLE everystep_workflow DROP INDEX everystep_workflow_scheduled, "
        "ADD INDEX everystep_workflow_scheduled (status, created_at, name)"
    ],
}
NOTIFY_DUE_TIME = """
CREATE OR REPLACE FUNCTION everystep_notify_scheduled() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('everystep_scheduled', extract(epoch FROM NEW.run_at)::text);
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
"""
NOTIFY_EMPTY = """
CREATE OR REPLACE FUNCTION everystep_notify_scheduled() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('everystep_scheduled', '');
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
"""


# The column is added by hand, in place: Django would rebuild the table on
# SQLite to add a NOT NULL column, and the rebuild would drop the partial
# indexes it does not know of (migrations 0002–0008). The database also gets
# a default of now, so that a process still running the previous version
# during a rolling deploy inserts runs that are due at once.
ADD_RUN_AT = {
    "postgresql": [
        "ALTER TABLE everystep_workflow "
        "ADD COLUMN IF NOT EXISTS run_at timestamp with time zone NULL",
        "UPDATE everystep_workflow SET run_at = created_at WHERE run_at IS NULL",
        "ALTER TABLE everystep_workflow ALTER COLUMN run_at SET DEFAULT now()",
        "ALTER TABLE everystep_workflow ALTER COLUMN run_at SET NOT NULL",
    ],
    "sqlite": [
        "ALTER TABLE everystep_workflow "
        "ADD COLUMN run_at datetime NOT NULL DEFAULT '1970-01-01 00:00:00'",
        "UPDATE everystep_workflow SET run_at = created_at",
    ],
    "mysql": [
        "ALTER TABLE everystep_workflow ADD COLUMN IF NOT EXISTS run_at datetime(6) NULL",
        "UPDATE everystep_workflow SET run_at = created_at WHERE run_at IS NULL",
        "ALTER TABLE everystep_workflow "
        "MODIFY run_at datetime(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6))",
    ],
}
DROP_RUN_AT = {
    vendor: ["ALTER TABLE everystep_workflow DROP COLUMN run_at"]
    for vendor in ("postgresql", "sqlite", "mysql")
}


class Migration(migrations.Migration):
    dependencies = [("everystep", "0008_status_counts_indexes")]

    # Not atomic: MariaDB cannot run DDL inside a transaction.
    atomic = False

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddField(
                    model_name="workflow",
                    name="run_at",
                    field=models.DateTimeField(default=timezone.now),
                )
            ],
            database_operations=[
                migrations.RunPython(
                    run_for_backend(ADD_RUN_AT), run_for_backend(DROP_RUN_AT), elidable=False
                )
            ],
        ),
        migrations.RunPython(
            run_for_backend(CLAIM_INDEX), run_for_backend(CREATION_INDEX), elidable=False
        ),
        migrations.RunPython(
            run_for_backend({"postgresql": [NOTIFY_DUE_TIME]}),
            run_for_backend({"postgresql": [NOTIFY_EMPTY]}),
            elidable=False,
        ),
    ]
