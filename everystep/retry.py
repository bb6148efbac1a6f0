"""Transient database errors, and retrying the engine's own writes through them.

A lost connection, a server restart, a deadlock, a serialization failure or a
lock-wait timeout says nothing about the run: the engine retries the write
with backoff instead of failing the run. Anything else (a data error, a
missing table, a bug) is not transient and propagates.
"""

import logging
import random
import time

from django.db import InterfaceError, OperationalError, connection

logger = logging.getLogger(__name__)

# PostgreSQL SQLSTATE classes and codes: connection exception, transaction
# rollback (serialization failure, deadlock), insufficient resources,
# operator intervention (admin shutdown, crash shutdown, cannot connect now),
# lock not available.
_PG_TRANSIENT_PREFIXES = ("08", "40", "53", "57P", "55P03")
# MySQL/MariaDB error numbers: too many connections, lock wait timeout,
# deadlock, connection killed, server shutdown, client-side connection errors.
_MYSQL_TRANSIENT_CODES = {1040, 1053, 1205, 1213, 1927, 2002, 2003, 2006, 2013, 2055, 4031}

MAX_BACKOFF = 5.0


def is_transient(exc):
    """Whether `exc` is a database error worth retrying unchanged."""
    if isinstance(exc, InterfaceError):
        return True
    if not isinstance(exc, OperationalError):
        return False
    cause = exc.__cause__ or exc
    sqlstate = getattr(cause, "sqlstate", None)
    if sqlstate is not None:
        return sqlstate.startswith(_PG_TRANSIENT_PREFIXES)
    if type(cause).__module__.startswith("psycopg"):
        return True  # a psycopg error without SQLSTATE: the connection failed
    code = cause.args[0] if cause.args else None
    if isinstance(code, int):
        return code in _MYSQL_TRANSIENT_CODES
    message = str(cause).lower()
    return "database is locked" in message or "disk i/o error" in message


def reset_connection():
    """Drop this thread's connection so the next query opens a fresh one."""
    try:
        connection.close()
    except Exception:  # noqa: BLE001 - the connection is already broken
        pass


def backoff_delays(first=0.05, cap=MAX_BACKOFF):
    """Exponential delays with jitter, capped: 0.05, 0.1, 0.2 … `cap` seconds."""
    delay = first
    while True:
        yield delay * random.uniform(0.5, 1.0)
        delay = min(delay * 2, cap)


def retrying(operation, *, what, should_stop=None):
    """Call ``operation(attempt)`` until it returns, retrying transient
    database errors with backoff; `attempt` counts from 1.

    `what` names the write in the log. `should_stop`, when given, is asked
    before each retry: if it returns true the last error is raised.
    """
    delays = backoff_delays()
    attempt = 1
    while True:
        try:
            return operation(attempt)
        except Exception as exc:
            if not is_transient(exc) or (should_stop is not None and should_stop()):
                raise
            delay = next(delays)
            logger.warning(
                "database unavailable while %s (attempt %d), retrying in %.2fs: %s",
                what,
                attempt,
                delay,
                _one_line(exc),
                extra={"action": "db_retry"},
            )
            reset_connection()
            time.sleep(delay)
            attempt += 1


def _one_line(exc):
    return " ".join(str(exc).split()) or type(exc).__name__
