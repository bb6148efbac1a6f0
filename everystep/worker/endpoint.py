"""The worker's HTTP endpoint: ``/metrics``, ``/healthz`` and ``/readyz``.

`Endpoint` serves, on a daemon thread, the default Prometheus registry at
``/metrics`` (`everystep.observe.metrics`) and the worker's two probes:

- ``/healthz``: 200 while the worker's loop turns; 503 once it has not
  turned for longer than it ever should (a wedged process: restart it);
- ``/readyz``: 200 once the worker has caught up and while the database
  answers and the name is held; 503 while starting, during an outage and
  while draining (take it out of rotation, but do not kill it).

Each probe answers with one line of text saying why. The endpoint does no
database query of its own for the probes: it reads the worker's state.
"""

import socket
from wsgiref.simple_server import WSGIRequestHandler, make_server

from django.db import connections
from prometheus_client import make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from everystep.errors import ConfigurationError


class Endpoint:
    """Serve the metrics and the probes of `health` on `bind`:`port`.

    `health()` returns ``(alive, ready, reason)``: two booleans and a short
    text for the probes' answers. `start()` raises `ConfigurationError` with
    one line when the port cannot be listened on (taken, not permitted).
    """

    def __init__(self, bind, port, health):
        self.bind = bind
        self.port = port
        self.health = health
        self._server = None

    def start(self, loops):
        """Listen, and serve on a thread of `loops` (`everystep.worker.loops.Loops`)."""
        server_class = _server_class(self.bind, self.port)
        try:
            self._server = make_server(
                self.bind, self.port, self._app, server_class, handler_class=_QuietHandler
            )
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise ConfigurationError(
                f"cannot serve metrics on {self.bind}:{self.port}: {reason}"
            ) from None
        loops.start("endpoint", self._server.serve_forever)

    def stop(self):
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def _app(self, environ, start_response):
        path = environ.get("PATH_INFO", "")
        if path in ("/healthz", "/readyz"):
            alive, ready, reason = self.health()
            ok = alive if path == "/healthz" else alive and ready
            status = "200 OK" if ok else "503 Service Unavailable"
            body = (("ok" if ok else reason) + "\n").encode()
            start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
            return [body]
        if path in ("/metrics", "/"):
            try:
                return _METRICS_APP(environ, start_response)
            finally:
                # The queue gauges may have opened a connection on this
                # short-lived request thread: close it with the thread.
                connections.close_all()
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [b"not found: try /metrics, /healthz or /readyz\n"]


_METRICS_APP = make_wsgi_app()


class _QuietHandler(WSGIRequestHandler):
    """No access log: a probe every few seconds would flood the worker's.
    A client that connects and says nothing is dropped after `timeout`."""

    timeout = 10

    def log_message(self, format, *args):
        pass


def _server_class(bind, port):
    """A threading WSGI server of the address family `bind` resolves to
    (``::`` listens on IPv6)."""
    try:
        family = socket.getaddrinfo(bind, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as exc:
        raise ConfigurationError(f"cannot serve metrics on {bind}:{port}: {exc.strerror}") from None

    class Server(ThreadingWSGIServer):
        address_family = family

    return Server
