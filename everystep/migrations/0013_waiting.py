"""Waiting for the world: messages, events, child runs and results.

- Messages sent to a run wait in its mailbox (``everystep_message``) until
  a ``receive()`` consumes them; events a run publishes are kept in
  ``everystep_event``, the latest per key read.
- A run records the run that started it (``parent_id``), and while it is
  parked in a wait, what it waits for: a topic (``wait_topic``) or a run
  (``wait_run``), until its ``run_at``. They are cleared as the wait ends
  (woken, claimed, cancelled), so that only the runs waiting now hold them.
- A run that ends (completed, failed, stopped, cancelled) makes the runs
  waiting for it due at once: a trigger does it on PostgreSQL and SQLite,
  the runner's final write on MariaDB (whose triggers cannot write the table
  they fire on). On PostgreSQL the end also notifies ``everystep_ended``
  with the run's id (`everystep.result` waits on it), and a scheduled run
  made due sooner notifies ``everystep_scheduled`` as a new one does.

Existing runs stay valid: the new columns are NULL. They are added by hand,
as 0009 adds ``run_at``, so that SQLite does not rebuild the table (which
would drop its partial indexes).
"""

from django.db import migrations, models
from django.utils import timezone

import everystep.models
from everystep.migrations._per_backend import run_for_backend

COLUMNS = {
    "postgresql": [
        "ALTER TABLE everystep_workflow ADD COLUMN IF NOT EXISTS parent_id uuid NULL",
        "ALTER TABLE everystep_workflow ADD COLUMN IF NOT EXISTS wait_topic varchar(255) NULL",
        "ALTER TABLE everystep_workflow ADD COLUMN IF NOT EXISTS wait_run uuid NULL",
    ],
    "sqlite": [
        "ALTER TABLE everystep_workflow ADD COLUMN parent_id char(32) NULL",
        "ALTER TABLE everystep_workflow ADD COLUMN wait_topic varchar(255) NULL",
        "ALTER TABLE everystep_workflow ADD COLUMN wait_run char(32) NULL",
    ],
    "mysql": [
        "ALTER TABLE everystep_workflow "
        "ADD COLUMN IF NOT EXISTS parent_id uuid NULL, "
        "ADD COLUMN IF NOT EXISTS wait_topic varchar(255) NULL, "
        "ADD COLUMN IF NOT EXISTS wait_run uuid NULL",
    ],
}
DROP_COLUMNS = {
    vendor: [
        f"ALTER TABLE everystep_workflow DROP COLUMN {column}"
        for column in ("wait_run", "wait_topic", "parent_id")
    ]
    for vendor in ("postgresql", "sqlite", "mysql")
}
# Runs by parent, the runs waiting for a run (its end wakes them) and the
# runs waiting for a message (the waiting gauge counts them): each holds
# only the rows where its column is set.
_INDEXED = (("parent", "parent_id"), ("wait_run", "wait_run"), ("wait_topic", "wait_topic"))
_PARTIAL = [
    f"CREATE INDEX IF NOT EXISTS everystep_workflow_{name} "
    f"ON everystep_workflow ({column}) WHERE {column} IS NOT NULL"
    for name, column in _INDEXED
]
INDEXES = {
    "postgresql": _PARTIAL,
    "sqlite": _PARTIAL,
    "mysql": [
        f"CREATE INDEX everystep_workflow_{name} ON everystep_workflow ({column})"
        for name, column in _INDEXED
    ],
}
DROP_INDEXES = {
    "postgresql": [f"DROP INDEX IF EXISTS everystep_workflow_{name}" for name, _ in _INDEXED],
    "sqlite": [f"DROP INDEX IF EXISTS everystep_workflow_{name}" for name, _ in _INDEXED],
    "mysql": [
        f"DROP INDEX everystep_workflow_{name} ON everystep_workflow" for name, _ in _INDEXED
    ],
}
ENDED = "('completed', 'failed', 'stopped', 'cancelled')"
TRIGGERS = {
    "postgresql": [
        # A scheduled run made due sooner (a message to a parked receiver,
        # the end of the run it waits for) wakes the workers as a new one.
        """
        CREATE TRIGGER everystep_workflow_woken
            AFTER UPDATE OF run_at ON everystep_workflow
            FOR EACH ROW WHEN (OLD.status = 'scheduled' AND NEW.status = 'scheduled'
                               AND NEW.run_at < OLD.run_at)
            EXECUTE FUNCTION everystep_notify_scheduled();
        """,
        f"""
        CREATE OR REPLACE FUNCTION everystep_run_ended() RETURNS trigger AS $$
        BEGIN
            UPDATE everystep_workflow SET run_at = LEAST(run_at, now()), wait_run = NULL
             WHERE wait_run = NEW.id AND status = 'scheduled';
            PERFORM pg_notify('everystep_ended', NEW.id::text);
            RETURN NULL;
        END;
        $$ LANGUAGE plpgsql;
        CREATE TRIGGER everystep_workflow_ended
            AFTER UPDATE OF status ON everystep_workflow
            FOR EACH ROW WHEN (NEW.status IN {ENDED} AND OLD.status <> NEW.status)
            EXECUTE FUNCTION everystep_run_ended();
        """,
    ],
    "sqlite": [
        # The time as Django stores it on SQLite (naive UTC text).
        f"""
        CREATE TRIGGER everystep_workflow_ended
            AFTER UPDATE OF status ON everystep_workflow
            FOR EACH ROW WHEN NEW.status IN {ENDED} AND OLD.status <> NEW.status
        BEGIN
            UPDATE everystep_workflow
               SET run_at = MIN(run_at, strftime('%Y-%m-%d %H:%M:%f', 'now')), wait_run = NULL
             WHERE wait_run = NEW.id AND status = 'scheduled';
        END
        """,
    ],
}
DROP_TRIGGERS = {
    "postgresql": [
        "DROP TRIGGER IF EXISTS everystep_workflow_woken ON everystep_workflow",
        "DROP TRIGGER IF EXISTS everystep_workflow_ended ON everystep_workflow",
        "DROP FUNCTION IF EXISTS everystep_run_ended()",
    ],
    "sqlite": ["DROP TRIGGER IF EXISTS everystep_workflow_ended"],
}


class Migration(migrations.Migration):
    dependencies = [("everystep", "0012_queues")]

    atomic = False  # MariaDB cannot run DDL inside a transaction

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddField(
                    model_name="workflow",
                    name="parent_id",
                    field=models.UUIDField(blank=True, null=True),
                ),
                migrations.AddField(
                    model_name="workflow",
                    name="wait_topic",
                    field=models.CharField(blank=True, max_length=255, null=True),
                ),
                migrations.AddField(
                    model_name="workflow",
                    name="wait_run",
                    field=models.UUIDField(blank=True, null=True),
                ),
            ],
            database_operations=[
                migrations.RunPython(
                    run_for_backend(COLUMNS), run_for_backend(DROP_COLUMNS), elidable=False
                ),
            ],
        ),
        migrations.RunPython(
            run_for_backend(INDEXES), run_for_backend(DROP_INDEXES), elidable=False
        ),
        migrations.AlterField(
            model_name="step",
            name="status",
            field=models.CharField(
                choices=[
                    ("done", "Done"),
                    ("failed", "Failed"),
                    ("started", "Started"),
                    ("retrying", "Retrying"),
                    ("waiting", "Waiting"),
                ],
                max_length=16,
            ),
        ),
        migrations.CreateModel(
            name="Message",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("topic", models.CharField(max_length=255)),
                ("payload", everystep.models.EncodedJSONField(blank=True, null=True)),
                ("idempotency_key", models.CharField(blank=True, max_length=255, null=True)),
                ("sent_at", models.DateTimeField(default=timezone.now)),
                ("consumed_by", models.CharField(blank=True, max_length=300, null=True)),
                ("consumed_at", models.DateTimeField(blank=True, null=True)),
                (
                    "workflow",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=models.deletion.CASCADE,
                        related_name="messages",
                        to="everystep.workflow",
                    ),
                ),
            ],
            options={
                "db_table": "everystep_message",
                "indexes": [
                    models.Index(
                        fields=["workflow", "topic", "id"], name="everystep_message_mailbox"
                    )
                ],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("workflow", "idempotency_key"),
                        name="everystep_message_idempotency",
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="Event",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("key", models.CharField(max_length=255)),
                ("value", everystep.models.EncodedJSONField(blank=True, null=True)),
                ("step_id", models.CharField(max_length=300)),
                ("set_at", models.DateTimeField(default=timezone.now)),
                (
                    "workflow",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=models.deletion.CASCADE,
                        related_name="events",
                        to="everystep.workflow",
                    ),
                ),
            ],
            options={
                "db_table": "everystep_event",
                "indexes": [
                    models.Index(fields=["workflow", "key", "id"], name="everystep_event_key")
                ],
            },
        ),
        migrations.RunPython(
            run_for_backend(TRIGGERS), run_for_backend(DROP_TRIGGERS), elidable=False
        ),
    ]
