"""The W3C trace context of the code that scheduled a run (§11), so that
its attempts' spans join the trace that asked for it."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("everystep", "0005_queue_gauge_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="workflow",
            name="trace_context",
            field=models.JSONField(blank=True, null=True),
        ),
    ]
