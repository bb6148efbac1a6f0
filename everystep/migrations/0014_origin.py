"""A run forked from another (`everystep fork`) names its origin.

The column is added by hand, in place, as 0009 adds ``run_at``: no table
rebuild on SQLite. Existing runs have none.
"""

from django.db import migrations, models

from everystep.migrations._per_backend import run_for_backend

COLUMN = {
    "postgresql": ["ALTER TABLE everystep_workflow ADD COLUMN IF NOT EXISTS origin_id uuid NULL"],
    "sqlite": ["ALTER TABLE everystep_workflow ADD COLUMN origin_id char(32) NULL"],
    "mysql": ["ALTER TABLE everystep_workflow ADD COLUMN IF NOT EXISTS origin_id uuid NULL"],
}
DROP_COLUMN = {
    vendor: ["ALTER TABLE everystep_workflow DROP COLUMN origin_id"]
    for vendor in ("postgresql", "sqlite", "mysql")
}
# A run's page lists the runs forked from it.
INDEX = {
    "postgresql": [
        "CREATE INDEX IF NOT EXISTS everystep_workflow_origin "
        "ON everystep_workflow (origin_id) WHERE origin_id IS NOT NULL"
    ],
    "sqlite": [
        "CREATE INDEX IF NOT EXISTS everystep_workflow_origin "
        "ON everystep_workflow (origin_id) WHERE origin_id IS NOT NULL"
    ],
    "mysql": ["CREATE INDEX everystep_workflow_origin ON everystep_workflow (origin_id)"],
}
DROP_INDEX = {
    "postgresql": ["DROP INDEX IF EXISTS everystep_workflow_origin"],
    "sqlite": ["DROP INDEX IF EXISTS everystep_workflow_origin"],
    "mysql": ["DROP INDEX everystep_workflow_origin ON everystep_workflow"],
}


class Migration(migrations.Migration):
    dependencies = [("everystep", "0013_waiting")]

    atomic = False  # MariaDB cannot run DDL inside a transaction

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddField(
                    model_name="workflow",
                    name="origin_id",
                    field=models.UUIDField(blank=True, null=True),
                ),
            ],
            database_operations=[
                migrations.RunPython(
                    run_for_backend(COLUMN), run_for_backend(DROP_COLUMN), elidable=False
                ),
            ],
        ),
        migrations.RunPython(run_for_backend(INDEX), run_for_backend(DROP_INDEX), elidable=False),
    ]
