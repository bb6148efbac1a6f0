"""An index of the runs by the time they ended, for retention.

`prune` (and the workers' hourly pruning) takes the runs that ended before
a time, oldest first, a batch at a time: with this index each batch reads
its own runs alone, instead of every finished run again. On PostgreSQL and
SQLite it holds the finished runs only (a partial index: the claim, which
reads unfinished runs, never considers it); MariaDB/MySQL have no partial
indexes.
"""

from django.db import migrations

from everystep.migrations._per_backend import run_for_backend

PARTIAL = [
    "CREATE INDEX IF NOT EXISTS everystep_run_ended "
    "ON everystep_workflow (completed_at) WHERE completed_at IS NOT NULL"
]
DROP = ["DROP INDEX IF EXISTS everystep_run_ended"]
FORWARD = {
    "postgresql": PARTIAL,
    "sqlite": PARTIAL,
    "mysql": ["CREATE INDEX everystep_run_ended ON everystep_workflow (completed_at)"],
}
BACKWARD = {
    "postgresql": DROP,
    "sqlite": DROP,
    "mysql": ["DROP INDEX everystep_run_ended ON everystep_workflow"],
}


class Migration(migrations.Migration):
    dependencies = [("everystep", "0015_recovered")]

    operations = [
        # Not atomic: MariaDB cannot run DDL inside a transaction.
        migrations.RunPython(
            run_for_backend(FORWARD), run_for_backend(BACKWARD), atomic=False, elidable=False
        )
    ]
