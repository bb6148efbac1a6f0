"""The index behind a worker's catchup and ``requeue --claimed-by`` holds
only running runs.

Both look for the ``running`` runs claimed under a name. Indexed on
(claimed_by, status), every finished run stays in the index, and every
claim — an UPDATE that moves runs to ``running`` — writes into an index
that grows with the history. A partial index (PostgreSQL, SQLite) holds only
the running runs, so its size follows the work in flight. MariaDB/MySQL have
no partial indexes and keep the composite one, which the model no longer
declares.
"""

from django.db import migrations

from everystep.migrations._per_backend import run_for_backend

PARTIAL = (
    "CREATE INDEX everystep_workflow_claimed_by ON everystep_workflow (claimed_by) "
    "WHERE status = 'running'"
)
COMPOSITE = "CREATE INDEX everystep_workflow_claimed_by ON everystep_workflow (claimed_by, status)"
DROP = "DROP INDEX everystep_workflow_claimed_by"

FORWARD = {"postgresql": [DROP, PARTIAL], "sqlite": [DROP, PARTIAL]}
BACKWARD = {"postgresql": [DROP, COMPOSITE], "sqlite": [DROP, COMPOSITE]}


class Migration(migrations.Migration):
    dependencies = [("everystep", "0002_claim_index_and_notify")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name="workflow", name="everystep_workflow_claimed_by")
            ],
            database_operations=[
                migrations.RunPython(
                    run_for_backend(FORWARD), run_for_backend(BACKWARD), elidable=False
                )
            ],
        )
    ]
