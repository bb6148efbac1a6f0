"""Django database settings from a database URL.

Accepted: ``postgres://`` and ``postgresql://`` (psycopg, server-side
parameter binding and prepared statements; ``?prepare_threshold=none``
turns the latter off for a connection pooler that cannot keep them),
``mysql://`` and
``mariadb://`` (PyMySQL), ``sqlite:///path`` (WAL journal, a busy timeout and
immediate transactions, so a claim holds the write lock from its first read).

A URL that cannot work is refused here, when the configuration is read,
rather than at the first connection: a server URL without a database name,
a SQLite file in a directory that does not exist, a PostgreSQL ``sslmode``
or connection option libpq does not know. `masked_url` and `url_secrets`
keep the passwords a URL carries (user-info, ``?password=``,
``?sslpassword=``) out of anything printed.
"""

import os
import urllib.parse

import dj_database_url

SCHEMES = ("postgres", "postgresql", "mysql", "mariadb", "sqlite")
SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
# OPTIONS that Django's PostgreSQL backend or psycopg take themselves; every
# other option is a libpq connection parameter.
DRIVER_OPTIONS = frozenset(
    {
        "assume_role",
        "autocommit",
        "context",
        "cursor_factory",
        "isolation_level",
        "pool",
        "prepare_threshold",
        "server_side_binding",
    }
)
# Query parameters whose value is a secret.
SECRET_PARAMETERS = ("password", "sslpassword", "passwd")
SQLITE_BUSY_TIMEOUT = 30  # seconds a writer waits for the lock before failing
PREPARE_THRESHOLD = 5  # executions of a statement before psycopg prepares it

dj_database_url.register("mariadb", "django.db.backends.mysql")


class DatabaseURLError(ValueError):
    """The database URL cannot be used; the message says why."""


def database_settings(url):
    """The ``DATABASES["default"]`` entry for `url`; raises `DatabaseURLError`."""
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if scheme not in SCHEMES:
        raise DatabaseURLError(
            f"unsupported scheme {scheme + '://' if scheme else '(none)'}: use one of "
            + ", ".join(f"{name}://" for name in SCHEMES)
        )
    try:
        settings = dj_database_url.parse(url)
    except ValueError as exc:
        raise DatabaseURLError(f"cannot parse the URL: {exc}") from None
    if scheme == "sqlite":
        if not settings["NAME"] or settings["NAME"] == ":memory:":
            raise DatabaseURLError("sqlite needs a file path, as in sqlite:///everystep.sqlite3")
        _check_directory(settings["NAME"])
        settings["OPTIONS"] = {
            "transaction_mode": "IMMEDIATE",
            "timeout": SQLITE_BUSY_TIMEOUT,
            "init_command": "PRAGMA journal_mode=WAL;",
            **settings.get("OPTIONS", {}),
        }
    elif scheme in ("postgres", "postgresql"):
        # Server-side binding and prepared statements: the statements a
        # worker repeats for every step are parsed and planned once per
        # connection, not once per step.
        options = {"server_side_binding": True, **settings.get("OPTIONS", {})}
        _check_database_name(scheme, settings)
        _check_sslmode(options)
        _check_connection_options(options)
        threshold = options.get("prepare_threshold", PREPARE_THRESHOLD)
        if isinstance(threshold, str) and threshold.lower() == "none":
            threshold = None
        elif not (threshold is None or isinstance(threshold, int)):
            raise DatabaseURLError(f"prepare_threshold must be a number or none, not {threshold!r}")
        options["prepare_threshold"] = threshold
        settings["OPTIONS"] = options
    elif scheme in ("mysql", "mariadb"):
        _check_database_name(scheme, settings)
        _use_pymysql()
        settings["OPTIONS"] = {"charset": "utf8mb4", **settings.get("OPTIONS", {})}
    return settings


def masked_url(url):
    """`url` with its passwords (user-info, ``password`` and ``sslpassword``
    query parameters) replaced by ``***``, safe to print."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        userinfo, _, hostinfo = netloc.rpartition("@")
        netloc = f"{userinfo.split(':', 1)[0]}:***@{hostinfo}"
    query = "&".join(
        f"{pair.partition('=')[0]}=***" if _is_secret_parameter(pair) else pair
        for pair in parts.query.split("&")
    )
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc, query=query))


def url_secrets(url):
    """The secret strings in `url`, as written and decoded: its user-info
    password and its ``password``/``sslpassword`` query values."""
    try:
        parts = urllib.parse.urlsplit(url)
        written = [parts.password or ""]
    except ValueError:
        return set()
    written += [
        pair.partition("=")[2] for pair in parts.query.split("&") if _is_secret_parameter(pair)
    ]
    decoded = [urllib.parse.unquote(text) for text in written]
    decoded += [urllib.parse.unquote_plus(text) for text in written]
    return {text for text in written + decoded if text}


def _is_secret_parameter(pair):
    name = urllib.parse.unquote_plus(pair.partition("=")[0]).lower()
    return "=" in pair and name in SECRET_PARAMETERS


def _check_directory(path):
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise DatabaseURLError(
            f"the directory {directory} for the SQLite file does not exist: create it, "
            "or fix the path"
        )
    # SQLite writes its journal and WAL files beside the database.
    if not os.access(directory, os.W_OK | os.X_OK):
        raise DatabaseURLError(
            f"the directory {directory} for the SQLite file is not writable by this user "
            f"(uid {os.getuid()}): mount a writable volume there (the image's /app/data), "
            "or fix its permissions"
        )
    for written in (path, f"{path}-wal", f"{path}-shm"):
        if os.path.exists(written) and not os.access(written, os.R_OK | os.W_OK):
            owner = os.stat(written).st_uid
            raise DatabaseURLError(
                f"the SQLite file {os.path.abspath(written)} is not writable by this user "
                f"(uid {os.getuid()}; it is uid {owner}'s): run as that uid, or let the group "
                f"write it (chmod g+w)"
            )


def _check_database_name(scheme, settings):
    # A PostgreSQL service file may name the database instead.
    if not settings["NAME"] and not settings.get("OPTIONS", {}).get("service"):
        raise DatabaseURLError(
            f"the URL names no database: use {scheme}://USER:PASSWORD@HOST:PORT/DATABASE"
        )


def _check_sslmode(options):
    sslmode = options.get("sslmode")
    if sslmode is not None and sslmode not in SSLMODES:
        raise DatabaseURLError(f"sslmode={sslmode!r} is not one of: {', '.join(SSLMODES)}")


def _check_connection_options(options):
    """Refuse a query parameter that is neither Django's nor psycopg's nor a
    libpq connection parameter: libpq would refuse it at every connection."""
    try:
        from psycopg import ProgrammingError
        from psycopg.conninfo import make_conninfo
    except ImportError:  # no libpq: the first connection says so
        return
    for name in sorted(set(options) - DRIVER_OPTIONS):
        try:
            make_conninfo(**{name: ""})
        except ProgrammingError:
            raise DatabaseURLError(
                f"unknown PostgreSQL connection option {name!r} in the query string: "
                "use libpq's connection parameters"
            ) from None


def _use_pymysql():
    """Let Django's MySQL backend run on PyMySQL unless mysqlclient is there."""
    try:
        import MySQLdb  # noqa: F401
    except ImportError:
        import pymysql

        pymysql.install_as_MySQLdb()
