"""A step's attempts: how many times its function was called (retry
policies), and the ``retrying`` status of a step that failed and waits for
its next attempt.

The column is added by hand with a constant default, which every backend
adds in place (Django would rebuild the table on SQLite).
"""

from django.db import migrations, models

from everystep.migrations._per_backend import run_for_backend

ADD = "ALTER TABLE everystep_step ADD COLUMN attempts integer NOT NULL DEFAULT 1"
DROP = "ALTER TABLE everystep_step DROP COLUMN attempts"
VENDORS = ("postgresql", "sqlite", "mysql")


class Migration(migrations.Migration):
    dependencies = [("everystep", "0009_run_at")]

    atomic = False  # MariaDB cannot run DDL inside a transaction

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddField(
                    model_name="step", name="attempts", field=models.IntegerField(default=1)
                )
            ],
            database_operations=[
                migrations.RunPython(
                    run_for_backend({vendor: [ADD] for vendor in VENDORS}),
                    run_for_backend({vendor: [DROP] for vendor in VENDORS}),
                    elidable=False,
                )
            ],
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
                ],
                max_length=16,
            ),
        ),
    ]
