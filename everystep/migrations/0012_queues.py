"""Queues: a run's queue, priority and concurrency key, when it first
started, the queues' limits, and the queues each worker serves.

Existing runs stay valid: they are in the ``default`` queue at priority 0,
without a key, and count as started (the rate limit counts first starts
from now on). The columns are added by hand, in place, with a database
default, as 0009 adds ``run_at``: no table rebuild on SQLite (which would
drop the partial indexes), and a process of the previous version inserting
during a rolling deploy gets the defaults.

The indexes:
- the claim's, scheduled runs by queue, priority and due time (a claim
  seeks each queue and priority present, then reads only due runs);
- runs by status, queue, priority and key: a limited queue's counts of
  running runs, and the (queue, priority) pairs of the scheduled runs;
- first starts by queue and time (a rate limit's count).

On PostgreSQL a run leaving ``running`` in a queue with a concurrency
limit notifies ``everystep_scheduled``: a worker waiting for the slot
claims at once.
"""

from django.db import migrations, models
from django.utils import timezone

from everystep.migrations._per_backend import run_for_backend

CLAIM_INDEX = (
    "CREATE INDEX IF NOT EXISTS everystep_workflow_claim "
    "ON everystep_workflow (queue, priority, run_at, name) WHERE status = 'scheduled'"
)
STARTED_INDEX = (
    "CREATE INDEX IF NOT EXISTS everystep_workflow_started "
    "ON everystep_workflow (queue, started_at) WHERE started_at IS NOT NULL"
)
COLUMNS = {
    "postgresql": [
        "ALTER TABLE everystep_workflow "
        "ADD COLUMN IF NOT EXISTS queue varchar(64) NOT NULL DEFAULT 'default'",
        "ALTER TABLE everystep_workflow "
        "ADD COLUMN IF NOT EXISTS priority smallint NOT NULL DEFAULT 0",
        "ALTER TABLE everystep_workflow ADD COLUMN IF NOT EXISTS concurrency_key varchar(255) NULL",
        "ALTER TABLE everystep_workflow "
        "ADD COLUMN IF NOT EXISTS started_at timestamp with time zone NULL",
    ],
    "sqlite": [
        "ALTER TABLE everystep_workflow ADD COLUMN queue varchar(64) NOT NULL DEFAULT 'default'",
        "ALTER TABLE everystep_workflow ADD COLUMN priority smallint NOT NULL DEFAULT 0",
        "ALTER TABLE everystep_workflow ADD COLUMN concurrency_key varchar(255) NULL",
        "ALTER TABLE everystep_workflow ADD COLUMN started_at datetime NULL",
    ],
    "mysql": [
        "ALTER TABLE everystep_workflow "
        "ADD COLUMN IF NOT EXISTS queue varchar(64) NOT NULL DEFAULT 'default', "
        "ADD COLUMN IF NOT EXISTS priority smallint NOT NULL DEFAULT 0, "
        "ADD COLUMN IF NOT EXISTS concurrency_key varchar(255) NULL, "
        "ADD COLUMN IF NOT EXISTS started_at datetime(6) NULL",
    ],
}
STARTED = {
    vendor: ["UPDATE everystep_workflow SET started_at = claimed_at WHERE claimed_at IS NOT NULL"]
    for vendor in ("postgresql", "sqlite", "mysql")
}
DROP_COLUMNS = {
    vendor: [
        f"ALTER TABLE everystep_workflow DROP COLUMN {column}"
        for column in ("started_at", "concurrency_key", "priority", "queue")
    ]
    for vendor in ("postgresql", "sqlite", "mysql")
}
# Runs by status, queue, priority and key: led by the status rather than
# partial on it, on every backend (beside the catchup's partial index of
# running runs, another would lead the planners to read the catchup through
# this one); and in the order the claim's seeks of (queue, priority) pairs
# read, which a planner may prefer to the claim's index for them.
STATUS_INDEX = (
    "CREATE INDEX everystep_workflow_queue_status "
    "ON everystep_workflow (status, queue, priority, concurrency_key)"
)
INDEXES = {
    "postgresql": [CLAIM_INDEX, STATUS_INDEX, STARTED_INDEX],
    "sqlite": [CLAIM_INDEX, STATUS_INDEX, STARTED_INDEX],
    "mysql": [
        "CREATE INDEX everystep_workflow_claim "
        "ON everystep_workflow (status, queue, priority, run_at, name)",
        STATUS_INDEX,
        "CREATE INDEX everystep_workflow_started ON everystep_workflow (queue, started_at)",
    ],
}
DROP_INDEXES = {
    "postgresql": [
        f"DROP INDEX IF EXISTS everystep_workflow_{name}"
        for name in ("claim", "queue_status", "started")
    ],
    "sqlite": [
        f"DROP INDEX IF EXISTS everystep_workflow_{name}"
        for name in ("claim", "queue_status", "started")
    ],
    "mysql": [
        f"DROP INDEX everystep_workflow_{name} ON everystep_workflow"
        for name in ("claim", "queue_status", "started")
    ],
}
NOTIFY_SLOT = """
CREATE OR REPLACE FUNCTION everystep_notify_slot() RETURNS trigger AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM everystep_queue
                WHERE name = NEW.queue
                  AND (concurrency IS NOT NULL OR key_concurrency IS NOT NULL)) THEN
        PERFORM pg_notify('everystep_scheduled', '');
    END IF;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER everystep_workflow_slot
    AFTER UPDATE OF status ON everystep_workflow
    FOR EACH ROW WHEN (OLD.status = 'running' AND NEW.status <> 'running')
    EXECUTE FUNCTION everystep_notify_slot();
"""
DROP_NOTIFY_SLOT = [
    "DROP TRIGGER IF EXISTS everystep_workflow_slot ON everystep_workflow",
    "DROP FUNCTION IF EXISTS everystep_notify_slot()",
]


class Migration(migrations.Migration):
    dependencies = [("everystep", "0011_cancel")]

    atomic = False  # MariaDB cannot run DDL inside a transaction

    operations = [
        migrations.CreateModel(
            name="Queue",
            fields=[
                ("name", models.CharField(max_length=64, primary_key=True, serialize=False)),
                ("concurrency", models.IntegerField(blank=True, null=True)),
                ("key_concurrency", models.IntegerField(blank=True, null=True)),
                ("rate_limit", models.IntegerField(blank=True, null=True)),
                ("rate_seconds", models.FloatField(blank=True, null=True)),
                ("declared_at", models.DateTimeField(default=timezone.now)),
            ],
            options={"db_table": "everystep_queue"},
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddField(
                    model_name="workflow",
                    name="queue",
                    field=models.CharField(default="default", max_length=64),
                ),
                migrations.AddField(
                    model_name="workflow",
                    name="priority",
                    field=models.SmallIntegerField(default=0),
                ),
                migrations.AddField(
                    model_name="workflow",
                    name="concurrency_key",
                    field=models.CharField(blank=True, max_length=255, null=True),
                ),
                migrations.AddField(
                    model_name="workflow",
                    name="started_at",
                    field=models.DateTimeField(blank=True, null=True),
                ),
            ],
            database_operations=[
                migrations.RunPython(
                    run_for_backend(COLUMNS), run_for_backend(DROP_COLUMNS), elidable=False
                ),
                migrations.RunPython(
                    run_for_backend(STARTED), migrations.RunPython.noop, elidable=False
                ),
            ],
        ),
        # The runs page's queue filter, newest first.
        migrations.AddIndex(
            model_name="workflow",
            index=models.Index(fields=["queue", "id"], name="everystep_run_queue"),
        ),
        migrations.AddField(
            model_name="worker",
            name="queues",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.RunPython(
            run_for_backend(INDEXES), run_for_backend(DROP_INDEXES), elidable=False
        ),
        migrations.RunPython(
            run_for_backend({"postgresql": [NOTIFY_SLOT]}),
            run_for_backend({"postgresql": DROP_NOTIFY_SLOT}),
            elidable=False,
        ),
    ]
