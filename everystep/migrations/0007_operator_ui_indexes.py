"""Indexes behind the operator UI's runs list.

The list shows runs newest first, by id: a UUIDv7, whose leading bits are
its creation time, so the primary key already serves the unfiltered list
and the filter on creation time. Each filter — status, workflow, worker —
seeks its runs through an index led by that column and ordered by id, so a
page of failed runs is found without reading a million completed ones. The
search by idempotency key reads its own index. (Indexes led by a workflow
or worker and the status would make its counts cheaper, but SQLite, for
want of a histogram, would then read one whole to count the queue's
running runs.)

The status filter of the finished statuses reads, on PostgreSQL and SQLite,
one partial index per status: an index of every run led by the status
would look to SQLite's planner (which keeps no histogram) as if half the
table had each status, and it would then read the whole table to count the
few scheduled runs of the queue gauges. The unfinished statuses have their
partial indexes already (migrations 0002, 0003, 0005). MariaDB/MySQL have
no partial indexes and get one index led by the status.
"""

from django.db import migrations, models

from everystep.migrations._per_backend import run_for_backend

FINISHED = ("completed", "failed", "stopped")
PARTIAL = [
    f"CREATE INDEX IF NOT EXISTS everystep_run_{status} ON everystep_workflow (id) "
    f"WHERE status = '{status}'"
    for status in FINISHED
]
DROP_PARTIAL = [f"DROP INDEX IF EXISTS everystep_run_{status}" for status in FINISHED]
FORWARD = {
    "postgresql": PARTIAL,
    "sqlite": PARTIAL,
    "mysql": ["CREATE INDEX everystep_run_status ON everystep_workflow (status, id)"],
}
BACKWARD = {
    "postgresql": DROP_PARTIAL,
    "sqlite": DROP_PARTIAL,
    "mysql": ["DROP INDEX everystep_run_status ON everystep_workflow"],
}


class Migration(migrations.Migration):
    dependencies = [("everystep", "0006_trace_context")]

    operations = [
        # Not atomic: MariaDB cannot run DDL inside a transaction.
        migrations.RunPython(
            run_for_backend(FORWARD), run_for_backend(BACKWARD), atomic=False, elidable=False
        ),
        migrations.AddIndex(
            model_name="workflow",
            index=models.Index(fields=["name", "id"], name="everystep_run_name"),
        ),
        migrations.AddIndex(
            model_name="workflow",
            index=models.Index(fields=["claimed_by", "id"], name="everystep_run_worker"),
        ),
        migrations.AddIndex(
            model_name="workflow",
            index=models.Index(fields=["idempotency_key"], name="everystep_run_key"),
        ),
    ]
