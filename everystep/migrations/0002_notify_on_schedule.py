"""On PostgreSQL, a trigger notifies the channel ``everystep_scheduled``
whenever a run becomes ``scheduled`` (inserted, requeued, resolved). The
notification is part of the writing transaction, so it is delivered only
on commit, and costs the writer no round trip; idle workers LISTEN and claim
at once instead of waiting for their next poll. Other backends poll."""

from django.db import migrations

CREATE = """
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

DROP = """
DROP TRIGGER IF EXISTS everystep_workflow_scheduled ON everystep_workflow;
DROP FUNCTION IF EXISTS everystep_notify_scheduled();
"""


def on_postgresql(sql):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [("everystep", "0001_initial")]

    operations = [migrations.RunPython(on_postgresql(CREATE), on_postgresql(DROP), elidable=False)]
