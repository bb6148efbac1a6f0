"""Connection timeouts, on by default, so a silent database is noticed.

A database that stops answering without closing its sockets (a pulled
cable, a failed-over host, a hung proxy) would otherwise hold a connection
for the kernel's default of about two hours. `harden` gives a connection's
settings these defaults, each overridable in the database URL or the
``OPTIONS`` of Django's ``DATABASES``:

- a connect timeout of `CONNECT_TIMEOUT` seconds, the handshake included;
- TCP keepalives: a silent idle peer is given up after
  `KEEPALIVE_IDLE` + `KEEPALIVE_COUNT` × `KEEPALIVE_INTERVAL` seconds;
- the kernel's TCP user timeout: data sent and unacknowledged for
  `USER_TIMEOUT` seconds fails the connection.

A peer that acknowledges packets yet answers nothing is caught by the
worker's own deadline on each operation (`everystep.resilience.deadline`).

The server needs the same care for the sessions a worker keeps open for
itself, its name lock's and its LISTEN's: one cut off from its worker
would stay open on the server for hours, holding the lock, a connection
slot and, for a LISTEN, the notification queue's tail. `keep_own_session`
asks the server for keepalives of its own and to end the session once it
sits idle for `IDLE_SESSION_TIMEOUT` seconds; the worker uses each of these
sessions every few seconds, so only a cut-off one is ever that idle.
"""

import socket

from django.db import DatabaseError

CONNECT_TIMEOUT = 5
KEEPALIVE_IDLE = 10
KEEPALIVE_INTERVAL = 5
KEEPALIVE_COUNT = 3
USER_TIMEOUT = 20
IDLE_SESSION_TIMEOUT = 30  # seconds; the worker uses its own sessions every 5

#: What `keep_own_session` sets, by vendor.
OWN_SESSION_SETTINGS = {
    "postgresql": (
        f"SET tcp_keepalives_idle = {KEEPALIVE_IDLE}",
        f"SET tcp_keepalives_interval = {KEEPALIVE_INTERVAL}",
        f"SET tcp_keepalives_count = {KEEPALIVE_COUNT}",
        f"SET idle_session_timeout = '{IDLE_SESSION_TIMEOUT}s'",
    ),
    "mysql": (f"SET SESSION wait_timeout = {IDLE_SESSION_TIMEOUT}",),
}

# Set on a MySQL settings dict whose handshake read timeout `harden` added,
# so that it is lifted once connected (the user's own long queries are not
# bounded by it).
_HANDSHAKE_MARK = "EVERYSTEP_HANDSHAKE_TIMEOUT"


def harden(settings_dict):
    """Add the timeout defaults to a ``DATABASES`` entry, in place, keeping
    every option already set. Returns it."""
    engine = settings_dict.get("ENGINE", "")
    options = settings_dict.setdefault("OPTIONS", {})
    if engine.endswith("postgresql"):
        options.setdefault("connect_timeout", CONNECT_TIMEOUT)
        options.setdefault("keepalives", 1)
        options.setdefault("keepalives_idle", KEEPALIVE_IDLE)
        options.setdefault("keepalives_interval", KEEPALIVE_INTERVAL)
        options.setdefault("keepalives_count", KEEPALIVE_COUNT)
        options.setdefault("tcp_user_timeout", USER_TIMEOUT * 1000)
    elif engine.endswith("mysql"):
        options.setdefault("connect_timeout", CONNECT_TIMEOUT)
        if "read_timeout" not in options:
            # PyMySQL's connect timeout covers the TCP connect only; this
            # bounds the handshake too, and is lifted once connected.
            options["read_timeout"] = CONNECT_TIMEOUT
            settings_dict[_HANDSHAKE_MARK] = True
    return settings_dict


def on_connection_created(sender, connection, **kwargs):
    """Django's ``connection_created`` receiver: on MySQL/MariaDB, set the
    keepalive and user-timeout socket options (PyMySQL takes none of them
    as connection options) and lift the handshake's read timeout."""
    if connection.vendor != "mysql":
        return
    raw = connection.connection
    sock = getattr(raw, "_sock", None)
    if sock is None:
        return
    if connection.settings_dict.get(_HANDSHAKE_MARK):
        raw._read_timeout = None
        sock.settimeout(None)
    configure_socket(sock)


def configure_socket(sock):
    """Keepalives and the TCP user timeout on a connected socket."""
    options = [
        (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPIDLE", None), KEEPALIVE_IDLE),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPINTVL", None), KEEPALIVE_INTERVAL),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPCNT", None), KEEPALIVE_COUNT),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_USER_TIMEOUT", None), USER_TIMEOUT * 1000),
    ]
    for level, name, value in options:
        if name is not None:
            try:
                sock.setsockopt(level, name, value)
            except OSError:
                pass  # not a TCP socket (a Unix socket), or not on this platform


def keep_own_session(wrapper):
    """Make the server end `wrapper`'s session (a Django connection,
    connected, in autocommit) soon after its worker is cut off from it:
    `OWN_SESSION_SETTINGS`. Best effort: a setting the server does not know
    (PostgreSQL before 14 has no idle session timeout) is left out."""
    for statement in OWN_SESSION_SETTINGS.get(wrapper.vendor, ()):
        try:
            with wrapper.cursor() as cursor:
                cursor.execute(statement)
        except DatabaseError:
            pass
