"""A fake Sentry server that receives what the real sentry-sdk sends over HTTP.

`FakeSentry()` listens on 127.0.0.1 at a free port. Its `dsn`
(``http://<public_key>@127.0.0.1:<port>/<project_id>``) goes to
``sentry_sdk.init(dsn=...)`` in the test process or, as ``SENTRY_DSN``, to a
worker subprocess: the SDK's own HTTP transport then delivers to it, the
same requests it sends to sentry.io. It promises:

- POST ``/api/<project_id>/envelope/`` (what sentry-sdk 2.x sends) and the
  legacy ``/api/<project_id>/store/`` (one JSON event) are accepted, with
  the body plain or ``Content-Encoding: gzip`` / ``deflate`` (the SDK's
  fallback when the Brotli module is missing), and ``br`` when that module
  is importable here; a chunked body is read too. The reply is 200 ``{}``.
- An envelope is parsed independently of the SDK: a JSON header line, then
  items, each a JSON item header line with its ``type`` and, when given,
  the payload's ``length`` in bytes (else the payload runs to the end of
  its line). Every item's type is kept in `item_types`, in arrival order;
  the payloads of ``event`` items (errors and messages, not transactions)
  are kept as dicts in `events`.
- A request that is not one of these, or whose ``sentry_key`` (the
  ``X-Sentry-Auth`` header or the query string) or project is not the
  DSN's, or whose body cannot be decoded or parsed, gets a 4xx reply and
  is kept, with the reason, in `rejected`, so a failed wait shows why
  nothing arrived instead of only that nothing did.
- `wait_for_events(count, timeout)` returns the events once at least
  `count` have arrived; it waits on a condition the request threads
  signal, and fails the test (`pytest.fail`) at the deadline with what did
  arrive.
- `close()` stops the server and releases the port; idempotent.

A request is recorded before its reply is sent, so once
``sentry_sdk.flush()`` has returned in this process the events it sent are
already in `events`. One daemon thread accepts, a daemon thread serves each
request (HTTP/1.0: one request per connection). If an HTTP proxy is set in
the environment, sentry-sdk uses it unless ``NO_PROXY`` names 127.0.0.1.
"""

from __future__ import annotations

import gzip
import json
import re
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

try:
    import brotli
except ImportError:  # sentry-sdk then compresses with gzip
    brotli = None

ENDPOINT = re.compile(r"^/api/(?P<project>[^/]+)/(?P<kind>envelope|store)/?$")
REQUEST_TIMEOUT = 10.0  # seconds a client may take to send its request
MAX_BODY = 64 << 20
POLL_INTERVAL = 0.05  # how soon serve_forever() notices close()


class Rejected(Exception):
    """A request the fake refuses: its HTTP status and why."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status
        self.reason = reason


class FakeSentry:
    """A Sentry endpoint on 127.0.0.1 that keeps what sentry-sdk sends (see the module doc)."""

    def __init__(self, public_key: str = "public", project_id: int | str = 1):
        self.public_key = public_key
        self.project_id = str(project_id)
        self._condition = threading.Condition()
        self._events: list[dict] = []
        self._item_types: list[str] = []
        self._rejected: list[str] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.fake = self
        self.port = self._server.server_address[1]
        self._closed = False
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": POLL_INTERVAL},
            name=f"fakesentry-{self.port}",
            daemon=True,
        )
        self._thread.start()

    def __repr__(self) -> str:
        return f"<FakeSentry 127.0.0.1:{self.port} events={len(self._events)}>"

    def __enter__(self) -> FakeSentry:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    @property
    def dsn(self) -> str:
        return f"http://{self.public_key}@127.0.0.1:{self.port}/{self.project_id}"

    @property
    def events(self) -> list[dict]:
        """The ``event`` items received so far, as dicts, in arrival order."""
        with self._condition:
            return list(self._events)

    @property
    def item_types(self) -> list[str]:
        """The type of every envelope item received (``event``, ``session``,
        ``client_report``, ``transaction``...), in arrival order."""
        with self._condition:
            return list(self._item_types)

    @property
    def rejected(self) -> list[str]:
        """The requests refused, each as ``"<status> <method> <path>: <reason>"``."""
        with self._condition:
            return list(self._rejected)

    def wait_for_events(self, count: int, timeout: float = 30.0) -> list[dict]:
        """All the events once at least `count` have arrived; fail the test
        if `timeout` seconds pass first."""
        deadline = time.monotonic() + timeout
        with self._condition:
            arrived = self._condition.wait_for(
                lambda: len(self._events) >= count, max(0.0, deadline - time.monotonic())
            )
            if arrived:
                return list(self._events)
            pytest.fail(
                f"{self!r}: timed out after {timeout}s waiting for {count} event(s); "
                f"received {len(self._events)}: {[describe(e) for e in self._events]}, "
                f"item types {self._item_types}, rejected {self._rejected}"
            )

    def close(self) -> None:
        """Stop serving and release the port. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    # Called by the request threads.

    def _receive(self, kind: str, body: bytes) -> None:
        if kind == "store":
            items = [({"type": "event"}, body)]
        else:
            _, items = parse_envelope(body)
        events = []
        for header, payload in items:
            if header.get("type") == "event":
                events.append(_json_object(payload, "event"))
        with self._condition:
            self._item_types.extend(str(header.get("type")) for header, _ in items)
            self._events.extend(events)
            self._condition.notify_all()

    def _reject(self, line: str) -> None:
        with self._condition:
            self._rejected.append(line)
            self._condition.notify_all()


class _Handler(BaseHTTPRequestHandler):
    timeout = REQUEST_TIMEOUT
    server_version = "FakeSentry"

    def do_POST(self):
        fake = self.server.fake
        try:
            kind = self._check_endpoint(fake)
            fake._receive(kind, self._decoded_body())
        except Rejected as exc:
            fake._reject(f"{exc.status} POST {self.path}: {exc.reason}")
            self._reply(exc.status, {"detail": exc.reason})
        except Exception as exc:
            fake._reject(f"400 POST {self.path}: {exc!r}")
            self._reply(400, {"detail": repr(exc)})
        else:
            self._reply(200, {})

    def do_GET(self):
        self.server.fake._reject(f"405 GET {self.path}: only POST is served")
        self._reply(405, {"detail": "only POST is served"})

    def log_message(self, format, *args):
        pass  # the test reads `rejected` instead

    def _check_endpoint(self, fake: FakeSentry) -> str:
        parts = urlsplit(self.path)
        match = ENDPOINT.match(parts.path)
        if match is None:
            raise Rejected(404, "not /api/<project>/envelope/ or /api/<project>/store/")
        if match["project"] != fake.project_id:
            raise Rejected(403, f"project {match['project']!r}, expected {fake.project_id!r}")
        key = _sentry_key(self.headers.get("X-Sentry-Auth", ""), parts.query)
        if key != fake.public_key:
            raise Rejected(403, f"sentry_key {key!r}, expected {fake.public_key!r}")
        return match["kind"]

    def _decoded_body(self) -> bytes:
        body = self._read_body()
        encoding = (self.headers.get("Content-Encoding") or "identity").strip().lower()
        if encoding == "identity":
            return body
        if encoding == "gzip":
            return gzip.decompress(body)
        if encoding == "deflate":
            return zlib.decompress(body)
        if encoding == "br" and brotli is not None:
            return brotli.decompress(body)
        raise Rejected(415, f"Content-Encoding {encoding!r} is not supported here")

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            return self._read_chunked()
        length = self.headers.get("Content-Length")
        if length is None:
            raise Rejected(411, "no Content-Length")
        if int(length) > MAX_BODY:
            raise Rejected(413, f"body of {length} bytes")
        body = self.rfile.read(int(length))
        if len(body) != int(length):
            raise Rejected(400, f"body cut off after {len(body)} of {length} bytes")
        return body

    def _read_chunked(self) -> bytes:
        chunks, total = [], 0
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(chunks)
            total += size
            if total > MAX_BODY:
                raise Rejected(413, f"chunked body over {MAX_BODY} bytes")
            chunks.append(self.rfile.read(size))
            self.rfile.readline()

    def _reply(self, status: int, payload: dict) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def parse_envelope(body: bytes) -> tuple[dict, list[tuple[dict, bytes]]]:
    """An envelope's header and its items as (item header, payload bytes)."""
    lines = body.split(b"\n", 1)
    header = _json_object(lines[0], "envelope header")
    rest = lines[1] if len(lines) > 1 else b""
    items = []
    position = 0
    while position < len(rest):
        end = rest.find(b"\n", position)
        end = len(rest) if end < 0 else end
        line = rest[position:end]
        position = end + 1
        if not line.strip():
            continue  # a blank line between items or at the end
        item_header = _json_object(line, "item header")
        length = item_header.get("length")
        if length is None:
            end = rest.find(b"\n", position)
            end = len(rest) if end < 0 else end
            payload, position = rest[position:end], end + 1
        else:
            payload = rest[position : position + length]
            if len(payload) != length:
                raise ValueError(f"item {item_header} cut off after {len(payload)} bytes")
            position += length
            if rest[position : position + 1] not in (b"\n", b""):
                raise ValueError(f"item {item_header} is longer than its length")
            position += 1
        items.append((item_header, payload))
    return header, items


def describe(event: dict) -> str:
    """A short line for an event: its exception(s) or its message."""
    exceptions = (event.get("exception") or {}).get("values") or []
    if exceptions:
        return "; ".join(f"{e.get('type')}: {e.get('value')}" for e in exceptions)
    message = event.get("message") or (event.get("logentry") or {}).get("message")
    return f"message {message!r}" if message else f"event {event.get('event_id')}"


def _json_object(data: bytes, what: str) -> dict:
    value = json.loads(data)
    if not isinstance(value, dict):
        raise ValueError(f"{what} is not a JSON object: {data[:200]!r}")
    return value


def _sentry_key(auth_header: str, query: str) -> str | None:
    """The sentry_key of an X-Sentry-Auth header ("Sentry sentry_key=..., ...") or query."""
    fields = auth_header.removeprefix("Sentry ").split(",")
    for field in fields:
        name, _, value = field.strip().partition("=")
        if name == "sentry_key":
            return value
    values = parse_qs(query).get("sentry_key")
    return values[0] if values else None


@pytest.fixture
def fake_sentry():
    """A started `FakeSentry`; point sentry-sdk at ``fake_sentry.dsn``. Closed at the end."""
    fake = FakeSentry()
    yield fake
    fake.close()
