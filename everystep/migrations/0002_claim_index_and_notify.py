"""What the claim needs, per backend.

The claim index holds only scheduled runs, in creation order, so a claim
costs the same with a million finished runs in the table as with none: a
partial index on PostgreSQL and SQLite; on MariaDB/MySQL, which have no
partial indexes, one led by the status, which seeks straight past them.

On PostgreSQL, a trigger also notifies the channel ``everystep_scheduled``
whenever a run becomes ``scheduled`` (inserted, requeued, resolved). The
notification belongs to the writing transaction — delivered only on commit —
and costs the writer no round trip; idle workers LISTEN and claim at once
instead of waiting for their next poll. Other backends poll.
"""

from django.db import migrations

from everystep.migrations._per_backend import run_for_backend

PARTIAL_INDEX = (
    "CREATE INDEX everystep_workflow_scheduled ON everystep_workflow (created_at) "
    "WHERE status = 'scheduled'"
)
COMPOSITE_INDEX = (
    "CREATE INDEX everystep_workflow_scheduled ON everystep_workflow (status, created_at)"
)
NOTIFY_TRIGGER = """
CREATE OR REPLACE FUNCTION everystep_notify_scheduled() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('everystep_scheduled', '');
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER everystep_workflow_scheduled
    AFTER INSERT OR UPDATE OF status ON everystep_workflow
    FOR EACH ROW WHEN (NEW.status = 'scheduled')
    EXECUTE FUNCTION everystep_notify_scheduled();
"""

FORWARD = {
    "postgresql": [PARTIAL_INDEX, NOTIFY_TRIGGER],
    "sqlite": [PARTIAL_INDEX],
    "mysql": [COMPOSITE_INDEX],
}
BACKWARD = {
    "postgresql": [
        "DROP TRIGGER IF EXISTS everystep_workflow_scheduled ON everystep_workflow",
        "DROP FUNCTION IF EXISTS everystep_notify_scheduled()",
        "DROP INDEX IF EXISTS everystep_workflow_scheduled",
    ],
    "sqlite": ["DROP INDEX IF EXISTS everystep_workflow_scheduled"],
    "mysql": ["DROP INDEX everystep_workflow_scheduled ON everystep_workflow"],
}


class Migration(migrations.Migration):
    dependencies = [("everystep", "0001_initial")]

    operations = [
        # Not atomic: MariaDB cannot run DDL inside a transaction.
        migrations.RunPython(
            run_for_backend(FORWARD), run_for_backend(BACKWARD), atomic=False, elidable=False
        )
    ]
