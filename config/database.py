"""Django database settings from a database URL.

Accepted: ``postgres://`` and ``postgresql://`` (psycopg, server-side
parameter binding and prepared statements; ``?prepare_threshold=none``
turns the latter off for a connection pooler that cannot keep them),
``mysql://`` and
``mariadb://`` (PyMySQL), ``sqlite:///path`` (WAL journal, a busy timeout and
immediate transactions, so a claim holds the write lock from its first read).
"""

import urllib.parse

import dj_database_url

SCHEMES = ("postgres", "postgresql", "mysql", "mariadb", "sqlite")
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
        threshold = options.get("prepare_threshold", PREPARE_THRESHOLD)
        if isinstance(threshold, str) and threshold.lower() == "none":
            threshold = None
        elif not (threshold is None or isinstance(threshold, int)):
            raise DatabaseURLError(f"prepare_threshold must be a number or none, not {threshold!r}")
        options["prepare_threshold"] = threshold
        settings["OPTIONS"] = options
    elif scheme in ("mysql", "mariadb"):
        _use_pymysql()
        settings["OPTIONS"] = {"charset": "utf8mb4", **settings.get("OPTIONS", {})}
    return settings


def masked_url(url):
    """`url` with its password replaced by ``***``, safe to print."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    userinfo, _, hostinfo = parts.netloc.rpartition("@")
    user = userinfo.split(":", 1)[0]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{hostinfo}"))


def _use_pymysql():
    """Let Django's MySQL backend run on PyMySQL unless mysqlclient is there."""
    try:
        import MySQLdb  # noqa: F401
    except ImportError:
        import pymysql

        pymysql.install_as_MySQLdb()
