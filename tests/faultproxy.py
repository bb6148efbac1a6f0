"""A fault-injecting TCP proxy that breaks a database connection the way
production does.

`FaultProxy(host, port)` listens on 127.0.0.1 at a free port and forwards
every connection it accepts to host:port. A client (the test process, or a
worker subprocess given `proxy.url(database_url)`) connects through it. The
faults are switched from any thread at any time; each control returns once
it is in force on the existing and the new connections:

- `pass_through()`: forward everything (the initial state; it also drops
  the latency, a pending `lose_next_reply` and a pending `silence_after`).
- `blackhole()`: the database goes silent without closing a socket. The
  connections open now stay open, what either side sends is read and
  discarded and nothing is forwarded, not even a close: the server never
  learns that the client went away. These connections stay silent for the
  rest of their life, also after `pass_through()` (their streams lost
  bytes). New connections complete the TCP handshake (the kernel's backlog)
  and wait unanswered; they are accepted and served normally once the
  blackhole ends. The proxy's kernel still ACKs everything, so only an
  application-level deadline notices the silence, never TCP keepalives or a
  TCP user timeout.
- `reset()`: every current connection is closed with a TCP RST (SO_LINGER
  0), towards the client and the server; new connections pass through.
- `refuse()`: the server is down: every current connection is reset and new
  ones are refused (ECONNREFUSED) until another control is called. The port
  stays reserved meanwhile.
- `lose_next_reply()`: switch to pass-through; the next chunk the server
  sends on any connection is then swallowed and that connection is reset on
  both sides: a reply lost after the server committed. Later replies pass.
- `lose_reply_to(pattern)`: the same for the reply to the next request
  whose bytes hold `pattern`, on that request's connection only.
- `silence_after(pattern)`: pass-through; the next request whose bytes hold
  `pattern` reaches the server, and from its reply on that connection goes
  silent as in a blackhole: the server still holds the session, inside its
  transaction if one was open. Other connections pass.
- `latency(seconds)`: every chunk read from now on is forwarded that much
  later, in order (a round trip takes at least twice as long); the other
  faults are unchanged.
- `close()`: stop the proxy; every connection is reset, the port released.

Counters (`accepted`, `bytes_to_server`, `bytes_to_client`,
`bytes_discarded`, `replies_lost`, `connections_silenced`,
`open_connections`) show what really went
through. One daemon thread serves all connections with a selector; it
sleeps until a socket is ready, a delayed chunk falls due or a control
arrives. Queued data is bounded per direction (reading stops while the
other side is slow). Listens on 127.0.0.1 only.
"""

from __future__ import annotations

import errno
import functools
import queue
import selectors
import socket
import struct
import threading
import time
from collections import deque
from urllib.parse import urlsplit, urlunsplit

import pytest

BACKLOG = 128
CHUNK = 65536
MAX_QUEUED = 1 << 20  # bytes waiting per direction before reading pauses
CONTROL_TIMEOUT = 10.0
DEFAULT_PORTS = {"postgres": 5432, "postgresql": 5432, "mysql": 3306, "mariadb": 3306}

PASS, BLACKHOLE, REFUSE = "pass", "blackhole", "refuse"


class ProxyError(RuntimeError):
    """The proxy's thread is gone or did not answer a control in time."""


class _Direction:
    """Chunks read from one side, waiting to be written to the other."""

    def __init__(self):
        self.chunks = deque()  # [due (monotonic), memoryview]
        self.queued = 0
        self.eof = False  # the source sent FIN
        self.shut = False  # FIN passed on to the sink
        self.blocked = False  # the sink's buffer is full: wait until writable

    def drop(self) -> int:
        dropped, self.chunks, self.queued = self.queued, deque(), 0
        return dropped


class _Connection:
    """A client socket and its upstream socket to the target."""

    def __init__(self, client: socket.socket, upstream: socket.socket, connecting: bool):
        self.client = client
        self.upstream = upstream
        self.connecting = connecting
        self.silent = False
        self.lose_reply = False  # the next reply on this connection is lost
        self.silence_on_reply = False  # the next reply silences this connection
        self.up = _Direction()  # client -> server
        self.down = _Direction()  # server -> client

    def sockets(self):
        return [s for s in (self.client, self.upstream) if s is not None]

    def source_of(self, direction):
        return self.client if direction is self.up else self.upstream

    def sink_of(self, direction):
        return self.upstream if direction is self.up else self.client


class FaultProxy:
    """A TCP proxy on 127.0.0.1 to host:port with switchable faults (see the module doc)."""

    def __init__(self, host: str, port: int):
        self.target = (host, int(port))
        self.accepted = 0
        self.bytes_to_server = 0
        self.bytes_to_client = 0
        self.bytes_discarded = 0
        self.replies_lost = 0
        self.connections_silenced = 0
        self._mode = PASS
        self._latency = 0.0
        self._lose_armed = False
        self._silence_pattern = None
        self._lose_pattern: bytes | None = None
        self._silence_pattern: bytes | None = None
        self._connections: set[_Connection] = set()
        self._interest: dict[socket.socket, int] = {}
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, self._drain_wake)
        # Holds the port for the proxy's life, also while no listener exists.
        self._placeholder = _reusable_socket()
        self._placeholder.bind(("127.0.0.1", 0))
        self.port = self._placeholder.getsockname()[1]
        self._listener = None
        self._listen()
        self._stopping = False
        self._error = None
        self._thread = threading.Thread(target=self._serve, name=f"faultproxy-{self.port}")
        self._thread.daemon = True
        self._thread.start()

    @classmethod
    def for_url(cls, database_url: str) -> FaultProxy:
        """A proxy to the host and port of a database URL."""
        parts = urlsplit(database_url)
        port = parts.port or DEFAULT_PORTS.get(parts.scheme.split("+")[0])
        if not parts.hostname or not port:
            raise ValueError(f"no host and port in {database_url!r}")
        return cls(parts.hostname, port)

    def __repr__(self) -> str:
        target = f"{self.target[0]}:{self.target[1]}"
        return f"<FaultProxy 127.0.0.1:{self.port} -> {target} {self._mode}>"

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # Controls, callable from any thread.

    def url(self, database_url: str) -> str:
        """database_url with its host and port replaced by the proxy's."""
        parts = urlsplit(database_url)
        userinfo, at, _ = parts.netloc.rpartition("@")
        netloc = f"{userinfo}{at}127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    def pass_through(self) -> None:
        self._control(self._do_pass_through)

    def blackhole(self) -> None:
        self._control(self._do_blackhole)

    def reset(self) -> None:
        self._control(self._do_reset)

    def refuse(self) -> None:
        self._control(self._do_refuse)

    def lose_next_reply(self) -> None:
        self._control(self._do_lose_next_reply)

    def lose_reply_to(self, pattern: bytes) -> None:
        """Pass-through; the reply to the next request holding `pattern` (a
        statement, a value it writes) is swallowed after the server ran it,
        and that connection is reset — a reply lost after a commit."""
        self._control(lambda: self._do_lose_reply_to(pattern))

    def silence_after(self, pattern: bytes) -> None:
        """Pass-through; the connection that sends the next request holding
        `pattern` goes silent once the server has run it — cut off in the
        middle of whatever it was doing, unknown to the server."""
        self._control(lambda: self._do_silence_after(pattern))

    def latency(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("latency must be >= 0")
        self._control(lambda: setattr(self, "_latency", float(seconds)))

    @property
    def mode(self) -> str:
        return self._mode

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    @property
    def bytes_forwarded(self) -> int:
        return self.bytes_to_server + self.bytes_to_client

    def close(self) -> None:
        """Reset every connection, release the port and end the thread. Idempotent."""
        if self._thread.is_alive():
            self._control(self._do_stop)
            self._thread.join(CONTROL_TIMEOUT)
        if self._thread.is_alive():
            raise ProxyError(f"{self!r} still running {CONTROL_TIMEOUT:.0f} s after close()")

    # The thread's side of the controls.

    def _control(self, action) -> None:
        """Run action on the proxy's thread; return once it has run."""
        if not self._thread.is_alive():
            raise ProxyError(f"{self!r} is closed{self._failure()}")
        done = threading.Event()
        self._commands.put((action, done))
        self._wake_w.send(b"x")
        if not done.wait(CONTROL_TIMEOUT):
            raise ProxyError(
                f"{self!r} did not answer a control in {CONTROL_TIMEOUT:.0f} s{self._failure()}"
            )

    def _failure(self) -> str:
        return f" (its thread failed: {self._error!r})" if self._error else ""

    def _do_pass_through(self):
        self._set_mode(PASS)
        self._latency = 0.0
        self._lose_armed = False

    def _do_blackhole(self):
        self._set_mode(BLACKHOLE)
        for conn in self._connections:
            conn.silent = True
            self.bytes_discarded += conn.up.drop() + conn.down.drop()

    def _do_reset(self):
        self._abort_all()
        self._set_mode(PASS)

    def _do_refuse(self):
        self._abort_all()
        self._set_mode(REFUSE)

    def _do_lose_next_reply(self):
        self._set_mode(PASS)
        self._lose_armed = True

    def _do_lose_reply_to(self, pattern):
        self._set_mode(PASS)
        self._lose_pattern = pattern

    def _do_silence_after(self, pattern):
        self._set_mode(PASS)
        self._silence_pattern = pattern

    def _do_stop(self):
        self._stopping = True

    def _set_mode(self, mode):
        self._mode = mode
        if mode == REFUSE:
            self._unlisten()
        elif self._listener is None:
            self._listen()

    # The event loop.

    def _serve(self):
        try:
            while not self._stopping:
                self._update_interest()
                for key, mask in self._selector.select(self._next_timeout()):
                    key.data(mask)
                self._flush_all()
        except BaseException as exc:
            self._error = exc
            raise
        finally:
            self._release()

    def _drain_wake(self, _mask):
        try:
            self._wake_r.recv(4096)
        except BlockingIOError:
            pass
        while True:
            try:
                action, done = self._commands.get_nowait()
            except queue.Empty:
                return
            action()
            done.set()

    def _next_timeout(self):
        """Seconds until the first delayed chunk falls due; None to wait for sockets only."""
        dues = [
            d.chunks[0][0]
            for conn in self._connections
            if not conn.silent
            for d in (conn.up, conn.down)
            if d.chunks and not d.blocked
        ]
        if not dues:
            return None
        return max(0.0, min(dues) - time.monotonic())

    def _listen(self):
        listener = _reusable_socket()
        listener.bind(("127.0.0.1", self.port))
        listener.listen(BACKLOG)
        listener.setblocking(False)
        self._listener = listener

    def _unlisten(self):
        listener, self._listener = self._listener, None
        if listener is not None:
            self._set_interest(listener, 0, None)
            listener.close()

    def _accept(self, _mask):
        while self._listener is not None and self._mode == PASS:
            try:
                client, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            self.accepted += 1
            self._open_upstream(client)

    def _open_upstream(self, client):
        client.setblocking(False)
        _no_delay(client)
        upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        upstream.setblocking(False)
        _no_delay(upstream)
        status = upstream.connect_ex(self.target)
        if status not in (0, errno.EINPROGRESS):
            _abort_socket(upstream)
            _abort_socket(client)
            return
        self._connections.add(_Connection(client, upstream, connecting=status != 0))

    def _on_socket(self, conn, sock, mask):
        if sock not in conn.sockets():
            return  # closed earlier in this round
        if mask & selectors.EVENT_WRITE:
            self._on_writable(conn, sock)
        if mask & selectors.EVENT_READ and sock in conn.sockets():
            self._on_readable(conn, sock)

    def _on_writable(self, conn, sock):
        if sock is conn.upstream and conn.connecting:
            conn.connecting = False
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                self._connection_lost(conn, sock)
            return
        (conn.up if sock is conn.upstream else conn.down).blocked = False

    def _on_readable(self, conn, sock):
        try:
            data = sock.recv(CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._connection_lost(conn, sock)
            return
        if not data:
            self._end_of_stream(conn, sock)
            return
        direction = conn.up if sock is conn.client else conn.down
        if direction is conn.up and self._lose_pattern is not None and self._lose_pattern in data:
            self._lose_pattern = None
            conn.lose_reply = True
        if (
            direction is conn.up
            and self._silence_pattern is not None
            and self._silence_pattern in data
        ):
            self._silence_pattern = None
            conn.silence_on_reply = True
        if direction is conn.down and conn.silence_on_reply:
            conn.silence_on_reply = False
            conn.silent = True
            self.connections_silenced += 1
            self.bytes_discarded += conn.up.drop() + conn.down.drop()
        if conn.silent:
            self.bytes_discarded += len(data)
        elif direction is conn.down and (self._lose_armed or conn.lose_reply):
            self._lose_armed = conn.lose_reply = False
            self.replies_lost += 1
            self.bytes_discarded += len(data)
            self._abort(conn)
        else:
            direction.chunks.append([time.monotonic() + self._latency, memoryview(data)])
            direction.queued += len(data)

    def _end_of_stream(self, conn, sock):
        if conn.silent:
            # Nothing reaches the other side, not even a close.
            self._close_socket(conn, sock)
        else:
            (conn.up if sock is conn.client else conn.down).eof = True

    def _connection_lost(self, conn, sock):
        if conn.silent:
            self._close_socket(conn, sock, abort=True)
        else:
            self._abort(conn)

    def _flush_all(self):
        now = time.monotonic()
        for conn in list(self._connections):
            if conn.silent:
                continue
            for direction in (conn.up, conn.down):
                if conn in self._connections:
                    self._flush(conn, direction, now)

    def _flush(self, conn, direction, now):
        """Write the chunks that are due; pass on a FIN once all is written."""
        sink = conn.sink_of(direction)
        if direction.blocked or (sink is conn.upstream and conn.connecting):
            return
        while direction.chunks and direction.chunks[0][0] <= now:
            chunk = direction.chunks[0]
            try:
                sent = sink.send(chunk[1])
            except (BlockingIOError, InterruptedError):
                direction.blocked = True
                return
            except OSError:
                self._abort(conn)
                return
            self._count_forwarded(direction is conn.up, sent)
            direction.queued -= sent
            if sent < len(chunk[1]):
                chunk[1] = chunk[1][sent:]
                direction.blocked = True
                return
            direction.chunks.popleft()
        if direction.eof and not direction.chunks and not direction.shut:
            direction.shut = True
            self._shut_write(conn, sink)

    def _count_forwarded(self, to_server, sent):
        if to_server:
            self.bytes_to_server += sent
        else:
            self.bytes_to_client += sent

    def _shut_write(self, conn, sink):
        try:
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            self._abort(conn)
            return
        if conn.up.shut and conn.down.shut:
            for sock in conn.sockets():
                self._close_socket(conn, sock)

    def _update_interest(self):
        if self._listener is not None:
            wanted = selectors.EVENT_READ if self._mode == PASS else 0
            self._set_interest(self._listener, wanted, self._accept)
        for conn in self._connections:
            for sock in conn.sockets():
                self._set_interest(sock, _wanted_events(conn, sock), None, conn)

    def _set_interest(self, sock, events, handler, conn=None):
        current = self._interest.get(sock, 0)
        if events == current:
            return
        if handler is None and conn is not None:
            handler = functools.partial(self._on_socket, conn, sock)
        if current == 0:
            self._selector.register(sock, events, handler)
        elif events == 0:
            self._selector.unregister(sock)
        else:
            self._selector.modify(sock, events, handler)
        if events:
            self._interest[sock] = events
        else:
            self._interest.pop(sock, None)

    # Closing.

    def _abort(self, conn):
        """Reset both sides of conn."""
        for sock in conn.sockets():
            self._close_socket(conn, sock, abort=True)

    def _abort_all(self):
        for conn in list(self._connections):
            self._abort(conn)

    def _close_socket(self, conn, sock, abort=False):
        self._set_interest(sock, 0, None)
        if abort:
            _abort_socket(sock)
        else:
            sock.close()
        if sock is conn.client:
            conn.client = None
        else:
            conn.upstream = None
        if not conn.sockets():
            self._connections.discard(conn)

    def _release(self):
        """Close every socket; called by the thread as it ends, and by close()."""
        self._abort_all()
        self._unlisten()
        for sock in (self._placeholder, self._wake_r, self._wake_w):
            sock.close()
        try:
            self._selector.close()
        except (OSError, RuntimeError):
            pass


def _wanted_events(conn, sock):
    """Selector events sock waits for: readable while there is room, writable when blocked."""
    reading = conn.up if sock is conn.client else conn.down
    writing = conn.down if sock is conn.client else conn.up
    events = 0
    if conn.silent or (not reading.eof and reading.queued < MAX_QUEUED):
        events |= selectors.EVENT_READ
    if sock is conn.upstream and conn.connecting:
        events |= selectors.EVENT_WRITE
    elif writing.blocked and not conn.silent:
        events |= selectors.EVENT_WRITE
    return events


def _reusable_socket():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    return sock


def _no_delay(sock):
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _abort_socket(sock):
    """Close sock with a TCP RST instead of a FIN."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


@pytest.fixture
def fault_proxy():
    """Start fault proxies: ``proxy = fault_proxy(database_url())`` (any URL
    with a host and port) or ``fault_proxy(host, port)``. Every one is
    closed at the end of the test."""
    started = []

    def start(target, port=None):
        proxy = FaultProxy(target, port) if port is not None else FaultProxy.for_url(target)
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        proxy.close()
