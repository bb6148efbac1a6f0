"""Cancelling a run: the terminal status ``cancelled``, and the time a
cancel was asked of a running run, which its runner honours at the next
step boundary.

The status filter of the operator UI gets its indexes for the new status,
as migrations 0007 and 0008 give the other finished ones: partial ones on
PostgreSQL and SQLite; on MariaDB/MySQL the indexes led by the status
already serve it.
"""

from django.db import migrations, models

from everystep.migrations._per_backend import run_for_backend

PARTIAL = [
    "CREATE INDEX IF NOT EXISTS everystep_run_cancelled ON everystep_workflow (id) "
    "WHERE status = 'cancelled'",
    "CREATE INDEX IF NOT EXISTS everystep_run_cancelled_name ON everystep_workflow (name, id) "
    "WHERE status = 'cancelled'",
    "CREATE INDEX IF NOT EXISTS everystep_run_cancelled_worker "
    "ON everystep_workflow (claimed_by, id) WHERE status = 'cancelled'",
]
DROP_PARTIAL = [
    f"DROP INDEX IF EXISTS everystep_run_cancelled{suffix}" for suffix in ("", "_name", "_worker")
]


class Migration(migrations.Migration):
    dependencies = [("everystep", "0010_step_attempts")]

    atomic = False  # MariaDB cannot run DDL inside a transaction

    operations = [
        # A nullable column without a default: added in place on every
        # backend (no table rebuild on SQLite).
        migrations.AddField(
            model_name="workflow",
            name="cancel_requested_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="workflow",
            name="status",
            field=models.CharField(
                choices=[
                    ("scheduled", "Scheduled"),
                    ("running", "Running"),
                    ("completed", "Completed"),
                    ("failed", "Failed"),
                    ("stopped", "Stopped"),
                    ("blocked", "Blocked"),
                    ("cancelled", "Cancelled"),
                ],
                default="scheduled",
                max_length=16,
            ),
        ),
        migrations.RunPython(
            run_for_backend({"postgresql": PARTIAL, "sqlite": PARTIAL}),
            run_for_backend({"postgresql": DROP_PARTIAL, "sqlite": DROP_PARTIAL}),
            elidable=False,
        ),
    ]
