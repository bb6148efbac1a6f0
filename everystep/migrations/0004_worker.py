"""The workers table: one row per worker name, with its heartbeat and the
workflows its process has (see `everystep.models.Worker`)."""

import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("everystep", "0003_claimed_by_index_without_finished_runs"),
    ]

    operations = [
        migrations.CreateModel(
            name="Worker",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("name", models.CharField(max_length=255, unique=True)),
                ("hostname", models.CharField(max_length=255)),
                ("pid", models.IntegerField()),
                ("version", models.CharField(max_length=64)),
                ("pool_size", models.IntegerField()),
                ("in_flight", models.IntegerField(default=0)),
                (
                    "state",
                    models.CharField(
                        choices=[
                            ("starting", "Starting"),
                            ("ready", "Ready"),
                            ("outage", "Outage"),
                            ("draining", "Draining"),
                            ("stopped", "Stopped"),
                        ],
                        default="starting",
                        max_length=16,
                    ),
                ),
                ("workflows", models.JSONField(default=list)),
                ("started_at", models.DateTimeField(default=django.utils.timezone.now)),
                ("heartbeat_at", models.DateTimeField(default=django.utils.timezone.now)),
                ("stopped_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={
                "db_table": "everystep_worker",
            },
        ),
    ]
