"""Database chores of the measurement subprocesses (Django set up)."""

import contextlib

from django.db import connection, transaction
from django.db.models import Count

from everystep.core import registry
from everystep.models import Workflow

RUN_TABLES = ("everystep_step", "everystep_message", "everystep_event", "everystep_workflow")


def clear_runs():
    """Remove every run, with its steps, messages and events."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"TRUNCATE {', '.join(RUN_TABLES)}")
        else:
            for table in RUN_TABLES:
                cursor.execute(f"DELETE FROM {table}")


def schedule_many(workflow, count, args=()):
    """Schedule `count` runs of `workflow` in one transaction, as an
    application would in a bulk import; they are claimable when it returns."""
    name = workflow.__everystep_workflow__
    queue, priority = registry.placement(name)
    with transaction.atomic():
        Workflow.objects.bulk_create(
            [
                Workflow(name=name, args=list(args), queue=queue, priority=priority)
                for _ in range(count)
            ],
            batch_size=1000,
        )


def unfinished():
    """How many runs are not yet terminal."""
    return Workflow.objects.exclude(status__in=Workflow.TERMINAL).count()


def outcome_counts():
    """Runs per status."""
    rows = Workflow.objects.values_list("status").annotate(count=Count("id")).order_by()
    return dict(rows)


class Dialect:
    """What differs between the backends' SQL for a bulk load (``INSERT …
    SELECT`` of rows computed from their number ``i``)."""

    def __init__(self, vendor):
        self.vendor = vendor

    def numbers(self, first, last):
        """A FROM item with one row per `i` from `first` to `last`."""
        if self.vendor == "postgresql":
            return f"generate_series(CAST({first} AS bigint), {last}) AS n(i)"
        if self.vendor == "mysql":  # MariaDB's Sequence engine
            return f"(SELECT seq AS i FROM seq_{first}_to_{last}) AS n"
        return (
            f"(WITH RECURSIVE n(i) AS (SELECT {first} UNION ALL SELECT i + 1 FROM n "
            f"WHERE i < {last}) SELECT i FROM n) AS n"
        )

    def run_id(self, ms):
        """A UUIDv7: `ms` in its first 48 bits, version 7, variant 10, then i."""
        if self.vendor == "postgresql":
            return (
                f"CAST(lpad(to_hex({ms}), 12, '0') || '70008' || lpad(to_hex(i), 15, '0') AS uuid)"
            )
        if self.vendor == "mysql":
            return f"LOWER(CONCAT(LPAD(HEX({ms}), 12, '0'), '70008', LPAD(HEX(i), 15, '0')))"
        return f"printf('%012x70008%015x', {ms}, i)"  # Django's char(32) form

    def moment(self, ms):
        """The UTC time `ms` milliseconds after the epoch, as the column holds it."""
        if self.vendor == "postgresql":
            return f"to_timestamp(({ms}) / 1000.0)"
        if self.vendor == "mysql":
            return f"TIMESTAMPADD(MICROSECOND, ({ms}) * 1000, '1970-01-01')"
        return f"strftime('%Y-%m-%d %H:%M:%f', ({ms}) / 1000.0, 'unixepoch')"

    def json(self, sql):
        return f"CAST({sql} AS jsonb)" if self.vendor == "postgresql" else sql

    def text(self, sql):
        return f"CAST({sql} AS {'CHAR' if self.vendor == 'mysql' else 'TEXT'})"

    def concat(self, *parts):
        return f"CONCAT({', '.join(parts)})" if self.vendor == "mysql" else " || ".join(parts)


@contextlib.contextmanager
def autovacuum_off(table):
    """Hold PostgreSQL's autovacuum off `table` meanwhile (elsewhere, nothing)."""
    if connection.vendor != "postgresql":
        yield
        return
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {table} RESET (autovacuum_enabled)")


def analyze(*tables, vacuum=False):
    """Fresh statistics for the planner on `tables` (after VACUUM on
    PostgreSQL with `vacuum`), and the load's dirty pages flushed, so that
    nothing timed next waits for them."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            for table in tables:
                cursor.execute(f"{'VACUUM ANALYZE' if vacuum else 'ANALYZE'} {table}")
            cursor.execute("CHECKPOINT")
        elif connection.vendor == "mysql":
            names = ", ".join(tables)
            cursor.execute(f"ANALYZE TABLE {names}")
            cursor.fetchall()
            cursor.execute(f"FLUSH TABLES {names} FOR EXPORT")
            cursor.execute("UNLOCK TABLES")
        else:
            cursor.execute("ANALYZE")
            cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
