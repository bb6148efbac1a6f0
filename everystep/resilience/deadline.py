"""A deadline on each of the engine's own database operations.

TCP keepalives and the kernel's user timeout notice a peer that vanished,
but not one that still acknowledges packets and answers nothing: a hung
proxy or pooler, a half-failed-over host. So every operation the engine
makes on a connection (a claim, a step record, a lock check) runs under
`guard`: if it has not returned within its deadline, one watchdog thread
shuts the connection's socket down, the blocked call fails at once with a
connection error, and the caller's ordinary retry takes over.

The user's own queries inside a step are never under a deadline: a long
report query is not a silent database. A guard costs no round trip: a dict
entry set and removed around the operation.
"""

import logging
import os
import socket
import threading
import time

logger = logging.getLogger(__name__)

DEFAULT_SECONDS = 10.0
_CHECK_INTERVAL = 0.5

_guards = {}  # guard in force → (expires at, connection wrapper, what)
_lock = threading.Lock()
_watchdog = None
seconds = DEFAULT_SECONDS  # the worker sets its own (--db-deadline)


class guard:
    """``with guard(wrapper, "claiming"):`` — give `wrapper`'s (a Django
    connection) socket up if the block takes longer than the deadline."""

    __slots__ = ("wrapper", "what")

    def __init__(self, wrapper, what):
        self.wrapper = wrapper
        self.what = what

    def __enter__(self):
        if _watchdog is None:
            _ensure_watchdog()
        _guards[self] = (time.monotonic() + seconds, self.wrapper, self.what)
        return self

    def __exit__(self, *exc_info):
        _guards.pop(self, None)


def _ensure_watchdog():
    """Start the watchdog thread, once (the caller saw none yet)."""
    global _watchdog
    with _lock:
        if _watchdog is None:
            _watchdog = threading.Thread(target=_watch, name="everystep-deadline", daemon=True)
            _watchdog.start()


def _watch():
    while True:
        time.sleep(_CHECK_INTERVAL)
        now = time.monotonic()
        for guarded, (expires, wrapper, what) in list(_guards.items()):
            if now >= expires and _guards.pop(guarded, None) is not None:
                logger.warning(
                    "the database did not answer within %.0fs while %s: giving the connection up",
                    seconds,
                    what,
                    extra={"action": "db_deadline"},
                )
                shut_down(wrapper)


def shut_down(wrapper):
    """Shut down the socket under a Django connection `wrapper`, so that a call
    blocked on it fails now; the connection is then unusable and is replaced."""
    fd = _socket_fd(wrapper.connection)
    if fd is None:
        return
    try:
        # A duplicate of the descriptor: shutting it down acts on the shared
        # socket, and closing the duplicate leaves the driver's own alone.
        with socket.socket(fileno=os.dup(fd)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed


def _socket_fd(raw):
    if raw is None:
        return None
    pgconn = getattr(raw, "pgconn", None)  # psycopg
    if pgconn is not None:
        try:
            return pgconn.socket
        except Exception:  # noqa: BLE001 - the connection is already closed
            return None
    sock = getattr(raw, "_sock", None)  # PyMySQL
    return sock.fileno() if sock is not None else None
