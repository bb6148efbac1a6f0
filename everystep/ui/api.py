"""The UI's JSON API and its live stream.

``api/runs`` (the runs page's filters as query parameters, ``cursor`` for
the next page), ``api/run/<id>``, ``api/workers`` and ``api/stream``: a
Server-Sent Events stream that sends a view's data (``view=runs`` with the
same filters, ``view=run&id=…``, ``view=workers``, ``view=blocked``) when it
changes, checked every `TICK` seconds. Each event's id is a digest of its
data, so a client reconnecting with ``Last-Event-ID`` is sent nothing it
has. A stream ends after `STREAM_SECONDS` (a WSGI worker is not held for
ever, and a proxy's idle timeout never cuts it); the browser reconnects
by itself. A stream holds a server thread: with the setting
``EVERYSTEP_UI_MAX_STREAMS`` (the standalone UI sets 8, half its threads),
at most that many are open at once, and one more is refused with 503,
which sends its page to polling. A Django project's server is its own to
size: without the setting, streams are not counted.
"""

import threading
import time

from django.conf import settings
from django.db import DatabaseError, close_old_connections, transaction
from django.http import StreamingHttpResponse
from django.views.decorators.cache import never_cache

from everystep.db import reads
from everystep.errors import EverystepError
from everystep.ui import access, responses, snapshots

TICK = 1.0
PING_SECONDS = 5.0
STREAM_SECONDS = 25.0

_stopping = threading.Event()
_open = 0  # streams open now
_open_lock = threading.Lock()


def stop_streams():
    """End every open stream at its next tick: the server is stopping (its
    clients reconnect to whichever instance serves next)."""
    _stopping.set()


def _answer(build):
    try:
        return responses.json(snapshots.public(build()))
    except snapshots.NotFound as exc:
        return responses.json({"error": str(exc)}, status=404)
    except EverystepError as exc:
        return responses.json({"error": str(exc)}, status=400)


@never_cache
@access.viewer(api=True)
@transaction.non_atomic_requests
def runs(request):
    return _answer(lambda: snapshots.runs(request.GET))


@never_cache
@access.viewer(api=True)
@transaction.non_atomic_requests
def run(request, run_id):
    return _answer(lambda: snapshots.run(run_id, request.GET.get("page", 1)))


@never_cache
@access.viewer(api=True)
@transaction.non_atomic_requests
def workers(request):
    return _answer(snapshots.workers)


VIEWS = {
    "runs": lambda query: snapshots.runs(query),
    "run": lambda query: snapshots.run(query.get("id", ""), query.get("page", 1)),
    "workers": lambda query: snapshots.workers(),
    "queues": lambda query: snapshots.queues(),
    "blocked": lambda query: snapshots.blocked(),
}
#: What tells, cheaply, that a view's data may have changed: its data is
#: built again only then (a run of many steps is not read every tick).
FINGERPRINTS = {
    "run": lambda query: reads.run_fingerprint(query.get("id", "")),
}


@never_cache
@access.viewer(api=True)
@transaction.non_atomic_requests
def stream(request):
    """Server-Sent Events: ``change`` with the view's data when it changes,
    ``ping`` every few seconds otherwise (so a client can tell a stream cut
    off by a buffering proxy from a quiet one), ``gone`` if the run goes."""
    view = request.GET.get("view", "runs")
    if view not in VIEWS:
        return responses.json({"error": f"view must be one of: {', '.join(VIEWS)}"}, status=400)
    build = lambda: snapshots.public(VIEWS[view](request.GET))  # noqa: E731
    try:
        first = build()
    except snapshots.NotFound as exc:
        return responses.json({"error": str(exc)}, status=404)
    except EverystepError as exc:
        return responses.json({"error": str(exc)}, status=400)
    if not _take_a_stream():
        return responses.json(
            {"error": "too many live streams open: poll api/ instead"}, status=503
        )
    # A page names the data it was rendered with: nothing is sent until it changes.
    last_id = request.headers.get("Last-Event-ID") or request.GET.get("last")
    fingerprint = FINGERPRINTS.get(view)
    changed = (lambda: fingerprint(request.GET)) if fingerprint else None
    # waitress tells when the client has gone (the standalone UI turns that
    # on), so a closed tab gives its place back within a tick, not at the
    # next write that fails.
    gone = request.META.get("waitress.client_disconnected")
    events = _Counted(_events(build, first, last_id, changed, gone))
    response = StreamingHttpResponse(events, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass each event on at once
    return response


def _take_a_stream():
    """Count one more open stream, unless that would pass the cap."""
    global _open
    cap = getattr(settings, "EVERYSTEP_UI_MAX_STREAMS", None)
    with _open_lock:
        if cap is not None and _open >= cap:
            return False
        _open += 1
        return True


class _Counted:
    """A stream's events; its count is given back when the server closes it
    (as a WSGI server does with every response, sent whole or cut off),
    even one never started."""

    def __init__(self, events):
        self._events = events
        self._closed = False

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._events)

    def close(self):
        global _open
        if self._closed:
            return
        self._closed = True
        self._events.close()
        with _open_lock:
            _open -= 1


def _events(build, data, last_id, fingerprint=None, client_gone=None):
    """The stream's events: `data` (built by `build`) whenever its digest is
    new. With a `fingerprint`, the data is built again only when that has
    changed since the last build; with `client_gone`, the stream ends at the
    first tick after it says so."""
    yield "retry: 1000\n\n"
    ends = time.monotonic() + STREAM_SECONDS
    last_sent = time.monotonic()
    built_at = fingerprint() if fingerprint is not None else None
    while True:
        if data is not None:
            text, digest = snapshots.encoded(data)
            if digest != last_id:
                yield f"id: {digest}\nevent: change\ndata: {text}\n\n"
                last_id, last_sent = digest, time.monotonic()
        if time.monotonic() - last_sent >= PING_SECONDS:
            yield "event: ping\ndata: {}\n\n"
            last_sent = time.monotonic()
        if time.monotonic() >= ends or _stopping.wait(TICK):
            return
        if client_gone is not None and client_gone():
            return
        try:
            if fingerprint is not None:
                now = fingerprint()
                if now == built_at:
                    data = None  # nothing changed: nothing to build or send
                    continue
                built_at = now
            data = build()
        except snapshots.NotFound:
            yield "event: gone\ndata: {}\n\n"
            return
        except DatabaseError:
            # The database is away: keep the stream, try again next tick.
            close_old_connections()
            data = None
