"""What the engine's raw SQL needs: parameters adapted to each backend,
values read back as Python, and the driver's own cursor (on PostgreSQL,
libpq itself: `everystep.db.libpq`) for the statements that run once per
step.
"""

import datetime
import functools
import json
from datetime import UTC

from django.utils import timezone

from everystep.core import serde


def execute(db, sql, params):
    """Run `sql` on the driver's own connection `db` and return its row
    count: the engine's own statements skip Django's cursor layer, which
    costs a step more than the rest of the engine's Python, and on
    PostgreSQL psycopg's cursor too (`everystep.db.libpq`). Errors are still
    Django's, execute wrappers still see the statement, and Django's query
    log (DEBUG, tests) still gets it, through Django's own cursor."""
    return _run(db, sql, params, _rowcount)


def fetch(db, sql, params):
    """Run `sql` as `execute` does, and return its rows as tuples."""
    return _run(db, sql, params, _rows)


def _rowcount(cursor):
    return cursor.rowcount


def _rows(cursor):
    return cursor.fetchall()


def _run(db, sql, params, read):
    if db.queries_logged:
        with db.cursor() as cursor:
            cursor.execute(sql, params)
            return read(cursor)
    if db.connection is None:
        db.ensure_connection()
    raw = db.connection
    cached = getattr(db, "_everystep_cursor", None)
    if cached is None or cached[0] is not raw:
        cached = db._everystep_cursor = (raw, raw.cursor())
    cursor = cached[1]
    send = _driver_execute
    if db.vendor == "postgresql":
        # What `read` reads, or None when the statement ran on the cursor.
        send = _through_libpq(read is _rows)
    elif db.vendor == "sqlite":
        sql = _qmark(sql)  # the driver's own placeholders
    for wrapper in reversed(db.execute_wrappers):
        send = functools.partial(wrapper, send)
    with db.wrap_database_errors:
        sent = send(sql, params, False, {"connection": db, "cursor": cursor})
        return read(cursor) if sent is None else sent


@functools.cache
def _through_libpq(rows):
    from everystep.db import libpq  # psycopg is installed only where PostgreSQL is used

    return libpq.fetch if rows else libpq.execute


@functools.cache
def _qmark(sql):
    return sql.replace("%s", "?")


def _driver_execute(sql, params, many, context):
    context["cursor"].execute(sql, params)


def datetime_param(db, value):
    """`value` as Django adapts it for a datetime column of `db`. The
    engine's own times are aware and in the connection's zone (UTC): those
    are adapted here, in a fraction of the time Django's general path takes,
    which a step pays twice."""
    if (
        value is not None
        and value.tzinfo is UTC
        and db.timezone is UTC
        and db.vendor != "postgresql"
    ):
        return str(value)[:-6]  # its text less "+00:00": the naive UTC text Django sends
    return db.ops.adapt_datetimefield_value(value)


def uuid_param(db, value):
    if value is None or db.features.has_native_uuid_field:
        return value
    return value.hex


def decode_json(value):
    if isinstance(value, str | bytes):
        value = json.loads(value)
    return serde.from_json(value)


def aware(value):
    """A datetime read by raw SQL as an aware one (SQLite returns the
    aggregate as text, MariaDB as a naive UTC time)."""
    if isinstance(value, str):
        value = datetime.datetime.fromisoformat(value)
    return value if timezone.is_aware(value) else value.replace(tzinfo=datetime.UTC)
