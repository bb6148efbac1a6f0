"""Indexes behind the operator UI's runs list.

The list shows runs newest first, by id: a UUIDv7, whose leading bits are
its creation time, so the primary key already serves the unfiltered list
and the filter on creation time. Each filter — status, workflow, worker —
seeks its runs through an index led by that column and ordered by id, so a
page of failed runs is found without reading a million completed ones. The
counts per status under a workflow or worker filter read an index led by
that column and the status: without it, counting one workflow's few
scheduled runs reads all its runs. The search by idempotency key reads its
own index.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("everystep", "0006_trace_context")]

    operations = [
        migrations.AddIndex(
            model_name="workflow",
            index=models.Index(fields=["status", "id"], name="everystep_run_status"),
        ),
        migrations.AddIndex(
            model_name="workflow",
            index=models.Index(fields=["name", "id"], name="everystep_run_name"),
        ),
        migrations.AddIndex(
            model_name="workflow",
            index=models.Index(fields=["name", "status", "id"], name="everystep_run_name_status"),
        ),
        migrations.AddIndex(
            model_name="workflow",
            index=models.Index(fields=["claimed_by", "id"], name="everystep_run_worker"),
        ),
        migrations.AddIndex(
            model_name="workflow",
            index=models.Index(
                fields=["claimed_by", "status", "id"], name="everystep_run_worker_status"
            ),
        ),
        migrations.AddIndex(
            model_name="workflow",
            index=models.Index(fields=["idempotency_key"], name="everystep_run_key"),
        ),
    ]
