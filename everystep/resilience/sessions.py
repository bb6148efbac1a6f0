"""Server sessions left behind by connections the engine gave up on, and ending them.

A connection given up on — cut off by the deadline, or replaced after an
outage — may still be alive on the server: a silent network never told the
server that the client went away. Such a session keeps a connection slot
and, when it was inside a transaction, its row locks: the runs that a claim
had just locked stay invisible to every ``SKIP LOCKED`` claim until the
server's own timeouts end the session, hours later by default.

So when the engine drops a connection that may have been cut off, it leaves
the session's id here (`abandon`, read from the driver: no round trip), and
once the database answers again the worker ends the ones still on the
server (`end_abandoned`). A session id is trusted only where it cannot name
someone else's session: on the same server as when the worker started, or
since it last changed (a failover, a restart: `note_server`), a PostgreSQL
pid must belong to a backend as old as the connection that opened it, and a
MariaDB/MySQL connection id to a server that has been up since then.

A connection pooler in transaction mode (PgBouncer) hands each transaction
to whichever server session is free: a session-level lock or LISTEN there
lands on a session that other clients share. The engine tells a pooler
from the server by the session id each gives (`behind_pooler`): the one
the driver got when it connected is the pooler's own. The name lock and
LISTEN then go to the database alias declared a session of its own
(`session_alias`, the ``EVERYSTEP_SESSION_DATABASE`` setting), and no
session is ever ended through the pooler: its ids name nothing on the
server, and its server sessions are its own to end.
"""

import threading
import time
from collections import deque

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError

from everystep.core import events
from everystep.resilience import deadline

MAX_REMEMBERED = 1000  # a long flapping outage must not grow the list without bound
NOTED_PER_CONNECTION = 8

# A session of ours (same user) whose backend is as old as the connection
# that opened it (`age` seconds, less a second for the connect): a pid reused
# by a backend started after ours ended is younger.
# pg_terminate_backend waits (up to a second) for the session to be gone,
# and with it its row locks: the take-back that follows then finds the runs.
_PG_END_SQL = """
    SELECT a.pid, pg_terminate_backend(a.pid, 1000)
      FROM pg_stat_activity a
      JOIN unnest(%s::int[], %s::float8[]) AS abandoned(pid, age) ON a.pid = abandoned.pid
     WHERE a.usename = current_user
       AND a.pid <> pg_backend_pid()
       AND a.backend_start <= now() - (abandoned.age - 1) * interval '1 second'
"""
_MYSQL_LIVE_SQL = """
    SELECT ID FROM information_schema.PROCESSLIST
     WHERE ID IN ({ids}) AND ID <> CONNECTION_ID()
       AND USER = SUBSTRING_INDEX(CURRENT_USER(), '@', 1)
"""
_MYSQL_UNKNOWN_THREAD = 1094

_abandoned = {}  # session id → when its connection opened (monotonic)
_server = None  # (the server's identity, since when it is known (monotonic))
_pooled = False  # whether the default database is reached through a pooler
_lock = threading.Lock()

# What tells one server (or one life of it) from another behind the same
# URL, and the session's id as the server gives it.
_SERVER_SQL = {
    "postgresql": "SELECT pg_postmaster_start_time()::text, pg_backend_pid()",
    "mysql": "SELECT CONCAT_WS(':', @@hostname, @@port, @@server_id), CONNECTION_ID()",
}


def session_alias():
    """The database alias of the engine's session-level work — the worker's
    name lock and its LISTEN: the one the ``EVERYSTEP_SESSION_DATABASE``
    setting names, else the default."""
    return getattr(settings, "EVERYSTEP_SESSION_DATABASE", None) or DEFAULT_DB_ALIAS


def declared_session(alias):
    """Whether `alias` was declared a session of its own (a direct
    connection, or a pooler's in session mode), pooler or not."""
    return alias == getattr(settings, "EVERYSTEP_SESSION_DATABASE", None)


def driver_session_id(wrapper):
    """The session id the driver of `wrapper` (connected) got at its start:
    the server's, or a pooler's own. No round trip."""
    raw = wrapper.connection
    if wrapper.vendor == "postgresql":
        return raw.info.backend_pid
    if wrapper.vendor == "mysql":
        return raw.thread_id()
    return None


def behind_pooler(wrapper, server_session_id):
    """Whether a pooler stands between `wrapper` and the server, which gave
    its session the id `server_session_id`."""
    return driver_session_id(wrapper) != server_session_id


def pooled():
    """Whether the default database is reached through a connection pooler
    (known once `note_server` ran)."""
    return _pooled


class Note:
    """What the engine notes on a Django connection wrapper each time it
    connects, from the driver (no round trip): the server sessions of its
    last few connections with when each opened (`abandon` remembers them)."""

    __slots__ = ("sessions",)

    def __init__(self):
        self.sessions = deque(maxlen=NOTED_PER_CONNECTION)


def noted(wrapper):
    """The `Note` on `wrapper` (a Django connection, or None), or None."""
    return getattr(wrapper, "everystep_note", None)


def on_connection_created(sender, connection, **kwargs):
    """Django's ``connection_created`` receiver: note on the connection
    wrapper the new session's id and when it opened, read while the
    connection is healthy (libpq forgets the id once the connection failed).
    The last few sessions are kept: Django may reconnect on its own after a
    failure (leaving a transaction whose rollback failed) before the engine
    drops the wrapper's connection."""
    note = connection.__dict__.get("everystep_note")
    if note is None:
        note = connection.everystep_note = Note()
    if connection.vendor in ("postgresql", "mysql"):
        note.sessions.append((driver_session_id(connection), time.monotonic()))


def abandon(wrapper):
    """Remember the sessions of `wrapper` (a Django connection), dropped or
    about to be dropped without the server's knowledge, so that
    `end_abandoned` ends those still on the server."""
    note = noted(wrapper)
    if note is None or not note.sessions:
        return  # no session, or ones already remembered or closed properly
    if _pooled:
        note.sessions.clear()  # a pooler's ids name no server session
        return
    with _lock:
        for sid, opened_at in note.sessions:
            if len(_abandoned) >= MAX_REMEMBERED:
                _abandoned.pop(next(iter(_abandoned)))
            _abandoned[sid] = opened_at
    note.sessions.clear()


def forget(wrapper):
    """`wrapper`'s sessions are closed properly: nothing to end."""
    note = noted(wrapper)
    if note is not None:
        note.sessions.clear()


def note_server(wrapper):
    """Note which server `wrapper` (the default database) talks to, and
    whether through a pooler; sessions opened before the server last changed
    are never ended (their ids may name other sessions there), nor any behind
    a pooler. One query; called when a worker starts and before ending
    sessions."""
    global _server, _pooled, _held
    if wrapper.vendor not in _SERVER_SQL:
        return
    with wrapper.cursor() as cursor:
        cursor.execute(_SERVER_SQL[wrapper.vendor])
        identity, server_session_id = cursor.fetchone()
    pooled_now = behind_pooler(wrapper, server_session_id)
    if pooled_now and not _pooled:
        _prepare_nothing(wrapper)
        events.announce("behind_pooler")
    _pooled = pooled_now
    if not _pooled:
        release_prepared(wrapper)
    with _lock:
        if _pooled:
            _held = None  # held for good
            _abandoned.clear()
        if _server is None:
            _server = (identity, 0.0)  # the first one seen: every session so far is there
        elif _server[0] != identity:
            _server = (identity, time.monotonic())


PSYCOPG_PREPARE_THRESHOLD = 5  # psycopg's default: prepared after 5 executions
_held = None  # while `hold_prepared` holds them: (whether the alias set its own, its value)


def hold_prepared(wrapper):
    """Prepare no statement on `wrapper`'s alias (the default database) until
    `note_server` has looked for a pooler: a worker's first statements (the
    migrations it waits for, its registration) may already go through one."""
    global _held
    if wrapper.vendor != "postgresql":
        return
    with _lock:
        if _held is not None:
            return
        options = wrapper.settings_dict.setdefault("OPTIONS", {})
        _held = ("prepare_threshold" in options, options.get("prepare_threshold"))
        _prepare_nothing(wrapper)


def release_prepared(wrapper):
    """Give `wrapper`'s alias its own prepare_threshold back, if
    `hold_prepared` holds it: no pooler was found, or the worker stops
    before it looked."""
    global _held
    with _lock:
        if _held is None:
            return
        (own, threshold), _held = _held, None
        options = wrapper.settings_dict["OPTIONS"]
        if own:
            options["prepare_threshold"] = threshold
        else:
            options.pop("prepare_threshold", None)
            threshold = PSYCOPG_PREPARE_THRESHOLD
    if wrapper.connection is not None:
        wrapper.connection.prepare_threshold = threshold


def _prepare_nothing(wrapper):
    """Turn psycopg's prepared statements off on `wrapper`'s connection and
    on every connection of its alias opened from now on: behind a pooler in
    transaction mode a statement prepared on one server session may be
    executed on another, which never saw it (PgBouncer keeps them across its
    sessions only from 1.21, with ``max_prepared_statements`` set)."""
    if wrapper.vendor != "postgresql":
        return
    wrapper.settings_dict.setdefault("OPTIONS", {})["prepare_threshold"] = None
    if wrapper.connection is not None:
        wrapper.connection.prepare_threshold = None


def forget_abandoned():
    """Give up ending the remembered sessions (the server refuses to)."""
    with _lock:
        _abandoned.clear()


def pending():
    """Whether sessions wait to be ended."""
    return bool(_abandoned)


def end_abandoned(wrapper):
    """End, through `wrapper`, the abandoned sessions still alive on the
    server; forget them all once the server answered. Returns how many it
    ended. Database errors propagate (the sessions stay remembered).
    Only the engine's default database is ever remembered here."""
    with deadline.guard(wrapper, "ending sessions left by cut-off connections"):
        note_server(wrapper)
        with _lock:
            known_since = _server[1]
            opened = {
                sid: opened_at for sid, opened_at in _abandoned.items() if opened_at >= known_since
            }
            forgotten = [sid for sid in _abandoned if sid not in opened]
            for sid in forgotten:
                _abandoned.pop(sid)
        if not opened:
            return 0
        ended = end(wrapper, opened)
    with _lock:
        for sid in opened:
            _abandoned.pop(sid, None)
    if ended:
        events.announce(
            "sessions_ended",
            count=len(ended),
            session_list=", ".join(str(sid) for sid in sorted(ended)),
        )
    return len(ended)


def end(wrapper, opened):
    """End, through `wrapper`, those of the sessions in `opened` (session id
    → when its connection opened, monotonic) that are alive on the server and
    can only be ours: of our user, and as old as the connection that opened
    them. Returns the ids it ended. PostgreSQL and MariaDB/MySQL only; the
    caller holds the deadline."""
    now = time.monotonic()
    ages = {sid: now - opened_at for sid, opened_at in opened.items()}
    if wrapper.vendor == "postgresql":
        return _end_postgresql(wrapper, ages)
    return _end_mysql(wrapper, ages)


def _end_postgresql(wrapper, ages):
    with wrapper.cursor() as cursor:
        cursor.execute(_PG_END_SQL, [list(ages), list(ages.values())])
        return [pid for pid, terminated in cursor.fetchall() if terminated]


def _end_mysql(wrapper, ages):
    ids = ", ".join(str(int(sid)) for sid in ages)
    with wrapper.cursor() as cursor:
        cursor.execute(_MYSQL_LIVE_SQL.format(ids=ids))
        live = [row[0] for row in cursor.fetchall()]
        if not live:
            return []
        # Connection ids count up from 1 again after a restart: trust only
        # the ids of connections opened since the server last started.
        cursor.execute("SHOW GLOBAL STATUS LIKE 'Uptime'")
        uptime = float(cursor.fetchone()[1])
        ended = []
        for sid in live:
            if ages[sid] >= uptime:
                continue
            try:
                cursor.execute(f"KILL CONNECTION {int(sid)}")
            except DatabaseError as exc:
                cause = exc.__cause__ or exc
                if not cause.args or cause.args[0] != _MYSQL_UNKNOWN_THREAD:
                    raise
                continue  # it ended meanwhile
            ended.append(sid)
        return ended
