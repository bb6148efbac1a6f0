"""Indexes behind the operator UI's counts per status under a filter.

The runs page counts the runs of each status under its filters: the failed
runs of one workflow, the completed runs of one worker. These indexes let
such a count read those runs alone, never all of the workflow's.

On PostgreSQL and SQLite, one partial index per finished status and filter
(the workflow or the worker, then the id): the unfinished statuses are
counted from the queue's own indexes, which hold few runs, and an index of
every run led by the status or the workflow would compete with them in the
planners' choice for the claim, the catchup and the queue gauges (SQLite's
planner, which keeps no histogram, chooses wrongly). MariaDB/MySQL have no
partial indexes; their planner weighs an index led by the status well.
"""

from django.db import migrations

from everystep.migrations._per_backend import run_for_backend

FINISHED = ("completed", "failed", "stopped")
FILTERS = {"name": "name", "worker": "claimed_by"}
PARTIAL = [
    f"CREATE INDEX IF NOT EXISTS everystep_run_{status}_{label} "
    f"ON everystep_workflow ({column}, id) WHERE status = '{status}'"
    for status in FINISHED
    for label, column in FILTERS.items()
]
DROP_PARTIAL = [
    f"DROP INDEX IF EXISTS everystep_run_{status}_{label}"
    for status in FINISHED
    for label in FILTERS
]
LED_BY_STATUS = (
    "ALTER TABLE everystep_workflow "
    "ADD INDEX everystep_run_status_name (status, name, id), "
    "ADD INDEX everystep_run_status_worker (status, claimed_by, id)"
)
DROP_LED_BY_STATUS = (
    "ALTER TABLE everystep_workflow "
    "DROP INDEX everystep_run_status_name, DROP INDEX everystep_run_status_worker"
)
FORWARD = {"postgresql": PARTIAL, "sqlite": PARTIAL, "mysql": [LED_BY_STATUS]}
BACKWARD = {"postgresql": DROP_PARTIAL, "sqlite": DROP_PARTIAL, "mysql": [DROP_LED_BY_STATUS]}


class Migration(migrations.Migration):
    dependencies = [("everystep", "0007_operator_ui_indexes")]

    operations = [
        # Not atomic: MariaDB cannot run DDL inside a transaction.
        migrations.RunPython(
            run_for_backend(FORWARD), run_for_backend(BACKWARD), atomic=False, elidable=False
        )
    ]
