"""The Prometheus test server scrapes a real /metrics endpoint and answers
PromQL about it: an HTTP server in the test process serves a fixed text
exposition, the way a worker serves its metrics."""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.prometheus import PrometheusServer, prometheus_server  # noqa: F401

# It touches no database.
pytestmark = pytest.mark.backends("postgres", "mariadb", "sqlite")

EXPOSITION = b'# TYPE demo_total counter\ndemo_total{kind="a"} 3\n'


class _Metrics(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path.split("?")[0] != "/metrics":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(EXPOSITION)))
        self.end_headers()
        self.wfile.write(EXPOSITION)

    def log_message(self, *args):
        pass


@pytest.fixture
def metrics_endpoint():
    """host:port of an HTTP server on 127.0.0.1 serving EXPOSITION at /metrics."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


def test_scrapes_the_endpoint_and_answers_promql(prometheus_server, metrics_endpoint):  # noqa: F811
    prom = prometheus_server([metrics_endpoint])

    result = prom.wait_for('demo_total{kind="a"}', timeout=30)
    assert PrometheusServer.value(result) == 3
    assert result[0]["metric"]["job"] == "everystep"
    assert result[0]["metric"]["instance"] == metrics_endpoint

    prom.wait_for("up == 1", timeout=30)
    assert prom.targets()[metrics_endpoint]["health"] == "up"
