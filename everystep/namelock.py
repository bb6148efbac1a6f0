"""One live worker per name: a lock on the name, held for the worker's life.

PostgreSQL uses a session advisory lock and MariaDB/MySQL ``GET_LOCK``, each
on a connection of the lock's own, so the lock lives exactly as long as that
connection: a worker that dies releases it. SQLite, single-host, uses an
exclusive file lock beside the database file, which the kernel releases when
the process dies. A lock lost with its connection (a database restart) is
taken again by `ensure()` before the worker claims anything more.
"""

import fcntl
import hashlib
import logging
import os
import re

from django.db import connections

logger = logging.getLogger(__name__)


def name_lock(name, alias="default"):
    """The right `NameLock` for the database behind `alias`."""
    vendor = connections[alias].vendor
    if vendor == "postgresql":
        return AdvisoryLock(name, alias)
    if vendor == "mysql":
        return MySQLLock(name, alias)
    if vendor == "sqlite":
        return FileLock(name, connections[alias].settings_dict["NAME"])
    raise NotImplementedError(f"no name lock for the {vendor} backend")


class NameLock:
    """A lock on a worker name. `try_acquire()` never blocks; `ensure()`
    checks the lock is still held and takes it again if it was lost, returning
    whether it is held now; `release()` lets it go."""

    def __init__(self, name):
        self.name = name

    def try_acquire(self):
        raise NotImplementedError

    def ensure(self):
        return True

    def release(self):
        raise NotImplementedError


class _ConnectionLock(NameLock):
    """A lock held by a database session of its own."""

    acquire_sql = verify_sql = release_sql = ""

    def __init__(self, name, alias):
        super().__init__(name)
        self.alias = alias
        self.key = self.lock_key(name)
        self._connection = None

    def lock_key(self, name):
        raise NotImplementedError

    def try_acquire(self):
        if self._connection is None:
            self._connection = connections.create_connection(self.alias)
        return self._scalar(self.acquire_sql) == 1

    def ensure(self):
        try:
            if self._scalar(self.verify_sql) == 1:
                return True
        except Exception:  # noqa: BLE001 - a dead connection: reconnect below
            pass
        self._drop_connection()
        logger.warning(
            "worker %s: the lock on its name was lost with its connection; taking it again",
            self.name,
            extra={"action": "name_lock_lost", "worker": self.name},
        )
        return self.try_acquire()

    def release(self):
        if self._connection is None:
            return
        try:
            self._scalar(self.release_sql)
        except Exception:  # noqa: BLE001 - closing the session releases it anyway
            pass
        self._drop_connection()

    def _scalar(self, sql):
        with self._connection.cursor() as cursor:
            cursor.execute(sql, [self.key])
            return cursor.fetchone()[0]

    def _drop_connection(self):
        if self._connection is not None:
            try:
                self._connection.close()
            except Exception:  # noqa: BLE001 - already broken
                pass
        self._connection = None


class AdvisoryLock(_ConnectionLock):
    """A PostgreSQL session-level advisory lock on a 64-bit hash of the name."""

    acquire_sql = "SELECT CASE WHEN pg_try_advisory_lock(%s) THEN 1 ELSE 0 END"
    verify_sql = (
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
        "AND pid = pg_backend_pid() AND ((classid::bigint << 32) | objid::bigint) = %s"
    )
    release_sql = "SELECT CASE WHEN pg_advisory_unlock(%s) THEN 1 ELSE 0 END"

    def lock_key(self, name):
        digest = hashlib.sha256(f"everystep-worker:{name}".encode()).digest()
        return int.from_bytes(digest[:8], "big") >> 1  # non-negative: see verify_sql


class MySQLLock(_ConnectionLock):
    """A MariaDB/MySQL ``GET_LOCK`` named after the worker (hashed: lock
    names are limited to 64 characters)."""

    acquire_sql = "SELECT GET_LOCK(%s, 0)"
    verify_sql = "SELECT IS_USED_LOCK(%s) = CONNECTION_ID()"
    release_sql = "SELECT RELEASE_LOCK(%s)"

    def lock_key(self, name):
        return "everystep:" + hashlib.sha256(name.encode()).hexdigest()[:48]


class FileLock(NameLock):
    """An exclusive ``flock`` on ``<database>.worker-<name>.lock``."""

    def __init__(self, name, database_path):
        super().__init__(name)
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:80]
        digest = hashlib.sha256(name.encode()).hexdigest()[:8]
        self.path = f"{database_path}.worker-{safe}-{digest}.lock"
        self._fd = None

    def try_acquire(self):
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self):
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the lock
            self._fd = None
