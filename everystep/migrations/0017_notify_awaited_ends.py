"""On PostgreSQL, a run's end notifies ``everystep_ended`` only when
someone awaits it.

PostgreSQL serializes the commits of the transactions that notify: each
holds one database-wide lock through its commit's WAL flush, so the ends
of all runs, from every worker, committed one at a time, with no group
commit. Yet only `everystep.result` listens there (`everystep.db.ends`),
and only for the runs it waits for. A waiter now marks its run
``awaited`` once it listens, and the end's trigger notifies for the runs
so marked: a run that ends between the two is seen by the read that
follows the mark.

The column exists on PostgreSQL only, the one backend that notifies; the
models do not hold it, so every insert takes its default. Adding a column
with a constant default rewrites no row.
"""

from django.db import migrations

from everystep.migrations._per_backend import run_for_backend


def _run_ended(notify):
    return f"""
        CREATE OR REPLACE FUNCTION everystep_run_ended() RETURNS trigger AS $$
        BEGIN
            UPDATE everystep_workflow SET run_at = LEAST(run_at, now()), wait_run = NULL
             WHERE wait_run = NEW.id AND status = 'scheduled';
            {notify}
            RETURN NULL;
        END;
        $$ LANGUAGE plpgsql;
    """


FORWARD = {
    "postgresql": [
        "ALTER TABLE everystep_workflow ADD COLUMN IF NOT EXISTS awaited boolean "
        "NOT NULL DEFAULT false",
        _run_ended(
            "IF NEW.awaited THEN PERFORM pg_notify('everystep_ended', NEW.id::text); END IF;"
        ),
    ],
}
BACKWARD = {
    "postgresql": [
        _run_ended("PERFORM pg_notify('everystep_ended', NEW.id::text);"),
        "ALTER TABLE everystep_workflow DROP COLUMN IF EXISTS awaited",
    ],
}


class Migration(migrations.Migration):
    dependencies = [("everystep", "0016_ended_index")]

    operations = [
        migrations.RunPython(run_for_backend(FORWARD), run_for_backend(BACKWARD), elidable=False),
    ]
