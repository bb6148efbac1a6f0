"""A worker's row says which live worker recovered the runs it left
claimed when it went silent, when, and how many (SPEC §16)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("everystep", "0014_origin")]

    operations = [
        migrations.AddField(
            model_name="worker",
            name="recovered_by",
            field=models.CharField(blank=True, max_length=255, null=True),
        ),
        migrations.AddField(
            model_name="worker",
            name="recovered_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="worker",
            name="recovered_runs",
            field=models.IntegerField(default=0),
        ),
    ]
