"""Which database errors are which: worth retrying unchanged (transient),
a busy database rather than an unreachable one (contention), a value too
large to store, or settings that cannot work. Pure: it reads the error and
the driver's codes, nothing else.
"""

from django.db import InterfaceError, OperationalError

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


def one_line(exc):
    """An exception's message on one line, for a log or an error."""
    return " ".join(str(exc).split()) or type(exc).__name__
