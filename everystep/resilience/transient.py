"""Transient database errors, and retrying the engine's own writes through them.

A lost connection, a server restart, a deadlock, a serialization failure or a
lock-wait timeout says nothing about the run: the engine retries the write
with backoff instead of failing the run. Anything else (a data error, a
missing table, a bug) is not transient and propagates.

Each attempt runs under the engine's deadline (`everystep.resilience.deadline`), so a
database that went silent fails the attempt instead of hanging it. An
outage is announced once, when the first operation fails, and its end once,
when one succeeds again, however many threads retry in between.
"""

import random
import threading
import time

from django.db import DEFAULT_DB_ALIAS, InterfaceError, OperationalError, connections

from everystep.core import events
from everystep.errors import ConfigurationError
from everystep.resilience import deadline, sessions

# PostgreSQL SQLSTATE classes and codes: connection exception, transaction
# rollback (serialization failure, deadlock), insufficient resources,
# operator intervention (admin shutdown, crash shutdown, cannot connect now),
# lock not available.
_PG_TRANSIENT_PREFIXES = ("08", "40", "53", "57P", "55P03")
# MySQL/MariaDB error numbers: too many connections, lock wait timeout,
# deadlock, connection killed, server shutdown, client-side connection errors.
_MYSQL_TRANSIENT_CODES = {1040, 1053, 1205, 1213, 1927, 2002, 2003, 2006, 2013, 2055, 4031}
# Of those, the ones that say the database is out of reach, not busy: a
# deadlock, a serialization failure or a lock-wait timeout is no outage.
_PG_CONTENTION_PREFIXES = ("40", "55P03")
_MYSQL_CONTENTION_CODES = {1205, 1213}

MAX_BACKOFF = 5.0

# Errors that say the settings are wrong rather than the database away: a
# bad password or user (SQLSTATE class 28), an unknown database (3D000);
# MySQL's access denied (1044, 1045, 1698), unknown database (1049),
# unknown host (2005). Connection failures without a code are told by their
# message.
_PG_CONFIGURATION_PREFIXES = ("28", "3D000")
_MYSQL_CONFIGURATION_CODES = {1044, 1045, 1049, 1698, 2005}
_CONFIGURATION_MESSAGES = (
    "password authentication failed",
    "no password supplied",
    "does not exist",
    "could not translate host name",
    "name or service not known",
    "nodename nor servname",
    "no such host",
)


def is_transient(exc):
    """Whether `exc` is a database error worth retrying unchanged."""
    if isinstance(exc, InterfaceError):
        return True
    if not isinstance(exc, OperationalError):
        return False
    cause = exc.__cause__ or exc
    if type(cause).__module__.startswith("psycopg"):
        sqlstate = getattr(cause, "sqlstate", None)
        if sqlstate is None:
            return True  # a psycopg error without SQLSTATE: the connection failed
        return sqlstate.startswith(_PG_TRANSIENT_PREFIXES)
    code = cause.args[0] if cause.args else None
    if isinstance(code, int):
        return code in _MYSQL_TRANSIENT_CODES
    message = str(cause).lower()
    return "database is locked" in message or "disk i/o error" in message


def is_contention(exc):
    """Whether `exc` is a transient error of a busy database (a deadlock, a
    serialization failure, a lock-wait timeout) rather than an unreachable one."""
    cause = exc.__cause__ or exc
    if type(cause).__module__.startswith("psycopg"):
        sqlstate = getattr(cause, "sqlstate", None) or ""
        return sqlstate.startswith(_PG_CONTENTION_PREFIXES)
    code = cause.args[0] if cause.args else None
    return code in _MYSQL_CONTENTION_CODES or "database is locked" in str(cause).lower()


def is_too_large(exc):
    """Whether `exc` is the database refusing a value as too large: MySQL's
    packet over ``max_allowed_packet`` (1153) or data too long (1406),
    PostgreSQL's program limit exceeded (54000)."""
    cause = exc.__cause__ or exc
    if type(cause).__module__.startswith("psycopg"):
        return (getattr(cause, "sqlstate", None) or "").startswith("54")
    code = cause.args[0] if cause.args else None
    return code in (1153, 1406)


def is_configuration_error(exc):
    """Whether `exc` says the database settings cannot work (a wrong password,
    an unknown user, database or host) rather than that it is unreachable.
    Worth retrying only once a connection has worked: then a DNS failure is
    an outage."""
    if not isinstance(exc, OperationalError | InterfaceError):
        return False
    cause = exc.__cause__ or exc
    sqlstate = getattr(cause, "sqlstate", None)
    if type(cause).__module__.startswith("psycopg") and sqlstate is not None:
        return sqlstate.startswith(_PG_CONFIGURATION_PREFIXES)
    code = cause.args[0] if cause.args else None
    if isinstance(code, int) and code in _MYSQL_CONFIGURATION_CODES:
        return True
    message = str(cause).lower()
    return any(text in message for text in _CONFIGURATION_MESSAGES)


class _Outage:
    """Whether this process sees the database as unreachable, and since when.

    `generation` counts the outages. A connection opened before the latest
    one may have been cut off without a word (a failed-over host, a hung
    proxy), so its holder replaces it before using it again instead of
    waiting out the deadline on it. An operation that began before the
    latest outage (`generation_of`) and fails after it ended is the outage's
    tail, not a new one — even when its failure's cleanup reconnected, as
    Django does when it leaves a transaction whose connection broke.
    """

    def __init__(self):
        self.since = None
        self.generation = 0
        self._lock = threading.Lock()

    def failed(self, what, exc, began_in=None):
        """An operation that began in outage generation `began_in`
        (`generation_of`; None when unknown) failed with `exc`. Contention
        (`is_contention`) is no outage, and neither is an operation that
        began before the latest outage: that outage cut it off."""
        if is_contention(exc):
            return
        with self._lock:
            if self.since is not None or (began_in is not None and began_in < self.generation):
                return
            self.since = time.monotonic()
            self.generation += 1
        events.announce("db_outage", what=what, error=one_line(exc))

    def succeeded(self):
        if self.since is None:
            return
        with self._lock:
            since, self.since = self.since, None
        if since is not None:
            events.announce("db_recovered", seconds=time.monotonic() - since)


outage = _Outage()


def generation_of(wrapper):
    """The outage generation of an operation starting now on `wrapper` (a
    Django connection): that of the connection it holds, or the current one
    when it will open a fresh connection."""
    note = sessions.noted(wrapper)
    if wrapper.connection is not None and note is not None:
        return note.outage_generation
    return outage.generation


def replace_if_outage(seen):
    """Reset this thread's connection if an outage began since generation
    `seen` (it may be cut off silently); returns the generation now."""
    if outage.generation != seen:
        reset_connection(cut_off=True)
    return outage.generation


def reset_connection(cut_off=False):
    """Drop this thread's connection so the next query opens a fresh one.
    `cut_off`: it may have been cut off without the server's knowledge, so
    its session is remembered to be ended later (`everystep.resilience.sessions`)."""
    wrapper = connections[DEFAULT_DB_ALIAS]
    if cut_off:
        sessions.abandon(wrapper)
    else:
        sessions.forget(wrapper)
    try:
        wrapper.close()
    except Exception:  # noqa: BLE001 - the connection is already broken
        pass


def drop_after(exc):
    """Drop this thread's connection after the database error `exc`; a
    connection error (not contention: the server answered) may have cut it off."""
    reset_connection(cut_off=is_transient(exc) and not is_contention(exc))


def backoff_delays(first=0.05, cap=MAX_BACKOFF):
    """Exponential delays with jitter, capped: 0.05, 0.1, 0.2 … `cap` seconds."""
    delay = first
    while True:
        yield delay * random.uniform(0.5, 1.0)
        delay = min(delay * 2, cap)


def retrying(operation, *, what, should_stop=None, fatal=None):
    """Call ``operation(attempt)`` until it returns, retrying transient
    database errors with backoff; `attempt` counts from 1. Each attempt is
    under the engine's deadline on this thread's connection.

    `what` names the operation in the log. `should_stop`, when given, is
    asked before each retry: if it returns true the last error is raised;
    so is an error for which `fatal(error)` is true.
    """
    delays = backoff_delays()
    attempt = 1
    while True:
        wrapper = connections[DEFAULT_DB_ALIAS]
        began_in = generation_of(wrapper)
        try:
            with deadline.guard(wrapper, what):
                result = operation(attempt)
        except Exception as exc:
            if (
                not is_transient(exc)
                or (fatal is not None and fatal(exc))
                or (should_stop is not None and should_stop())
            ):
                raise
            outage.failed(what, exc, began_in)
            delay = next(delays)
            events.announce(
                "db_retry", what=what, attempt=attempt, delay=delay, error=one_line(exc)
            )
            drop_after(exc)
            time.sleep(delay)
            attempt += 1
        else:
            outage.succeeded()
            return result


def first_contact(operation, *, what, should_stop=None):
    """`retrying` for a process's first operations on the database: an error
    saying the settings cannot work (`is_configuration_error`) raises
    `ConfigurationError` at once instead of being retried as an outage."""
    try:
        return retrying(operation, what=what, should_stop=should_stop, fatal=is_configuration_error)
    except Exception as exc:
        if is_configuration_error(exc):
            raise ConfigurationError(
                f"the database refuses these settings: {one_line(exc)}"
            ) from None
        raise


def one_line(exc):
    """An exception's message on one line, for a log or an error."""
    return " ".join(str(exc).split()) or type(exc).__name__
