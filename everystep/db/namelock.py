"""One live worker per name: a lock on the name, held for the worker's life.

PostgreSQL uses a session advisory lock and MariaDB/MySQL ``GET_LOCK``, each
on a connection of the lock's own, so the lock lives exactly as long as that
connection's session: a worker that dies releases it. SQLite, single-host,
uses an exclusive file lock beside the database file, which the kernel
releases when the process dies.

The server must notice a dead session quickly, or a worker killed during a
network partition would keep its name for hours (the kernel's keepalive
default). So the lock's session is one the server ends once it sits idle
(`everystep.resilience.timeouts.keep_own_session`); the worker checks the
lock every few seconds, so only a dead or cut-off worker is ever that idle.

The lock's connection goes to the database alias of the engine's
session-level work (`everystep.resilience.sessions.session_alias`). A
lock reached through a connection pooler that was not declared a session
of its own is refused (`ConfigurationError`): in transaction mode the
pooler would hand the lock's session to other clients, and a second worker
could take the name on it.

A lock lost with its connection (a restart, a partition) is taken again by
`ensure()` before the worker claims anything more. If the server still
shows the lock held by this worker's own previous session, that session is
ended first (`everystep.resilience.sessions.end`). If another process holds it,
`ensure()` raises `NameLost`: the worker must stop, never run as a second
holder.
"""

import fcntl
import hashlib
import os
import re
import threading
import time

from django.db import connections

from everystep.core import events
from everystep.errors import ConfigurationError
from everystep.resilience import deadline, sessions
from everystep.resilience.timeouts import keep_own_session


class NameLost(Exception):
    """Another process took this worker's name while its lock was lost."""


def name_lock(name, alias=None):
    """The right `NameLock` for the database behind `alias` (by default
    the one for session-level work)."""
    alias = alias or sessions.session_alias()
    vendor = connections[alias].vendor
    if vendor == "postgresql":
        return AdvisoryLock(name, alias)
    if vendor == "mysql":
        return MySQLLock(name, alias)
    if vendor == "sqlite":
        if connections[alias].is_in_memory_db():
            return ProcessLock(name)  # no other process can open it
        return FileLock(name, connections[alias].settings_dict["NAME"])
    raise NotImplementedError(f"no name lock for the {vendor} backend")


class NameLock:
    """A lock on a worker name. `try_acquire()` never blocks; `ensure()`
    checks the lock is still held and takes it again if it was lost,
    returning whether it is held now (raising `NameLost` if another process
    has it); `release()` lets it go."""

    def __init__(self, name):
        self.name = name

    #: The lock's own database connection, if it has one.
    connection = None

    def try_acquire(self):
        raise NotImplementedError

    def ensure(self, reconnect=False):
        return True

    def still_held(self):
        """Whether the lock taken is held still (its session may have ended)."""
        return True

    def release(self):
        raise NotImplementedError

    def held_by_stopped_process(self):
        """Whether the lock is held by a process the kernel has stopped
        (SIGSTOP): held, yet not live. A database's own
        lock needs no such answer: the server ends the session of a holder
        that stopped answering (`everystep.resilience.timeouts.keep_own_session`)."""
        return False


class _ConnectionLock(NameLock):
    """A lock held by a database session of its own."""

    acquire_sql = verify_sql = release_sql = holder_sql = session_sql = ""

    def __init__(self, name, alias):
        super().__init__(name)
        self.alias = alias
        self.key = self.lock_key(name)
        self._connection = None
        self._session = None  # the session that holds (or last held) the lock
        self._session_opened_at = None  # when its connection opened (monotonic)
        self._connected_at = None  # when the lock's connection opened (monotonic)
        self._connection_session = None  # the server's session of that connection
        self._lost = False
        self._held = False  # taken on the current connection

    def lock_key(self, name):
        raise NotImplementedError

    @property
    def connection(self):
        return self._connection

    def try_acquire(self):
        if self._connection is None:
            self._connection = connections.create_connection(self.alias)
            self._connection.inc_thread_sharing()  # taken on one thread, kept on another
            with deadline.guard(self._connection, "setting up the name lock's session"):
                self._connection.ensure_connection()
                self._connected_at = time.monotonic()
                self._connection.set_autocommit(True)
                keep_own_session(self._connection)
            self._connection_session = self._scalar(self.session_sql)
            self._refuse_an_undeclared_pooler()
        if self._scalar(self.acquire_sql, [self.key]) != 1:
            return False
        self._held = True
        self._session = self._connection_session
        self._session_opened_at = self._connected_at
        return True

    def _refuse_an_undeclared_pooler(self):
        """Raise `ConfigurationError` if a connection pooler stands between
        the lock's connection and the server and nobody declared it a
        session of its own: the server's session id, read when the
        connection opened, is not the driver's."""
        if sessions.declared_session(self.alias):
            return
        session = self._connection_session
        server_session_id = session[0] if isinstance(session, tuple) else session
        if sessions.behind_pooler(self._connection, server_session_id):
            self._drop_connection()
            raise ConfigurationError(
                "the database is reached through a connection pooler (the server's session id "
                "is not the connection's), where the lock on the worker's name and LISTEN have "
                "no session of their own: set EVERYSTEP_SESSION_URL (the Django setting "
                "EVERYSTEP_SESSION_DATABASE) to a direct connection, or to the pooler in "
                "session mode"
            )

    def ensure(self, reconnect=False):
        """Check the lock is held; if it was lost with its connection, take it
        again. Raises `NameLost` when another process holds it now, and the
        database error when the database cannot be reached. With `reconnect`
        (the connection may have been cut off silently) it does not ask the
        old connection but takes the lock again on a new one."""
        try:
            if not reconnect and self._scalar(self.verify_sql, [self.key]) == 1:
                return True
        except Exception:  # noqa: BLE001 - a dead connection: reconnect below
            pass
        self._drop_connection()
        if not self._lost:
            events.announce("name_lock_lost", worker=self.name)
            self._lost = True
        if not self.try_acquire():
            holder = self._scalar(self.holder_sql, [self.key])
            if holder is None or holder != self._session:
                raise NameLost(
                    f"worker name {self.name!r} was taken by another process while this "
                    f"worker's lock was lost: exiting so that the name has one live holder"
                )
            # Our own session from before the loss, not yet found dead by the
            # server: end it and take the lock now.
            session_id = holder[0] if isinstance(holder, tuple) else holder
            with deadline.guard(self._connection, "ending the name lock's old session"):
                sessions.end(self._connection, {session_id: self._session_opened_at})
            if not self.try_acquire():
                return False  # the session is still ending: try again next check
        self._lost = False
        return True

    def still_held(self):
        try:
            return self._held and self._scalar(self.verify_sql, [self.key]) == 1
        except Exception:  # noqa: BLE001 - a connection that fails holds nothing
            return False

    def release(self):
        """Let the lock go, if taken (a server logs an unlock of a lock not
        held), and close its connection."""
        if self._connection is None:
            return
        if self._held:
            try:
                self._scalar(self.release_sql, [self.key])
            except Exception:  # noqa: BLE001 - closing the session releases it anyway
                pass
        self._drop_connection()

    def _scalar(self, sql, params=()):
        with deadline.guard(self._connection, "checking the name lock"):
            with self._connection.cursor() as cursor:
                cursor.execute(sql, params)
                row = cursor.fetchone()
        if row is None:
            return None
        return row[0] if len(row) == 1 else tuple(row)

    def _drop_connection(self):
        self._held = False
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
    # A session is its backend pid and start time (pids are reused).
    session_sql = "SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()"
    holder_sql = (
        "SELECT a.pid, a.backend_start FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
        "WHERE l.locktype = 'advisory' AND l.granted "
        "AND ((l.classid::bigint << 32) | l.objid::bigint) = %s"
    )

    def lock_key(self, name):
        digest = hashlib.sha256(f"everystep-worker:{name}".encode()).digest()
        return int.from_bytes(digest[:8], "big") >> 1  # non-negative: see verify_sql


class MySQLLock(_ConnectionLock):
    """A MariaDB/MySQL ``GET_LOCK`` named after the worker (hashed: lock
    names are limited to 64 characters)."""

    acquire_sql = "SELECT GET_LOCK(%s, 0)"
    verify_sql = "SELECT IS_USED_LOCK(%s) = CONNECTION_ID()"
    release_sql = "SELECT RELEASE_LOCK(%s)"
    session_sql = "SELECT CONNECTION_ID()"
    holder_sql = "SELECT IS_USED_LOCK(%s)"

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
        # Read-only: flock needs no more, and another uid of the volume's group
        # (a restart under a platform-given uid) can open the file it made.
        fd = os.open(self.path, os.O_RDONLY | os.O_CREAT, 0o644)
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

    def held_by_stopped_process(self):
        """A file lock outlives a stopped holder, and no server ends it: ask
        the kernel which process holds it (``/proc/locks``, matched by inode
        and confirmed by the holder's open files, since the device number
        it prints may not be the one ``stat`` gives) and whether that
        process is stopped (SIGSTOP: ``/proc/PID/stat`` state ``T``)."""
        try:
            inode = os.stat(self.path).st_ino
            with open("/proc/locks") as locks:
                lines = locks.read().splitlines()
        except OSError:
            return False
        for line in lines:
            fields = line.split()
            if "->" in fields or len(fields) < 6 or fields[1] != "FLOCK":
                continue  # "->": a request waiting for the lock, not its holder
            if fields[5].rpartition(":")[2] == str(inode) and _has_open(fields[4], self.path):
                return _stopped(fields[4])
        return False


def _has_open(pid, path):
    """Whether the process `pid` (text) has the file `path` open."""
    try:
        descriptors = os.listdir(f"/proc/{int(pid)}/fd")
    except (OSError, ValueError):
        return False
    target = os.path.realpath(path)
    for descriptor in descriptors:
        try:
            if os.readlink(f"/proc/{int(pid)}/fd/{descriptor}") == target:
                return True
        except OSError:
            continue
    return False


def _stopped(pid):
    """Whether the process `pid` (text) is stopped by a signal; False when it
    is gone or not visible from here (another PID namespace shows as 0)."""
    try:
        with open(f"/proc/{int(pid)}/stat") as stat:
            state = stat.read().rpartition(")")[2].split()[0]
    except (OSError, ValueError, IndexError):
        return False
    return state == "T"


class ProcessLock(NameLock):
    """A name held within this process: for an in-memory SQLite database
    (Django's test database), which no other process can share — and which
    must leave no lock file behind."""

    _held = set()
    _guard = threading.Lock()
    held = False

    def try_acquire(self):
        with self._guard:
            if self.name in self._held:
                return False
            self._held.add(self.name)
            self.held = True
            return True

    def release(self):
        with self._guard:
            if self.held:
                self._held.discard(self.name)
                self.held = False
