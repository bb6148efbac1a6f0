"""A real Prometheus server that scrapes the test's /metrics endpoints.

`PrometheusServer(["127.0.0.1:9123"])` runs Debian's /usr/bin/prometheus
(scripts/install-test-deps installs it) in a directory of its own: its
configuration, its TSDB data dir and its log (`prometheus.log`) live there.
It listens on 127.0.0.1 at a free port and scrapes the given host:port
targets at /metrics every second, as the job `everystep`. `start()` returns
once the server answers ready; `stop()` ends it by PID (SIGTERM, then
SIGKILL of its own process group after a deadline), never by name.

- `query(promql)` is the result list of an instant query (`/api/v1/query`):
  `[{"metric": {labels}, "value": [time, "3"]}, ...]`, empty when nothing
  matches. A query Prometheus rejects raises `PrometheusError`.
- `wait_for(promql, predicate=None, timeout=60)` polls until the result is
  non-empty (or `predicate(result)` is true) and returns it; after the
  deadline it fails the test with the last result, the targets' health and
  the end of the log.
- `targets()` is the health of the active targets by instance (host:port).
- `value(result)` reads the one sample of a result as a float.

The `prometheus_server` fixture is a factory: `prometheus_server(targets)`
returns a started server; every server it started is stopped at the end of
the test. Only the standard library talks to Prometheus, bypassing any HTTP
proxy of the environment.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.processes import ServerProcess, tail
from tests.servers import free_port

FIX = "run scripts/install-test-deps, which installs Debian's prometheus package"
START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
REQUEST_TIMEOUT = 5.0
POLL_INTERVAL = 0.1
JOB = "everystep"

# Requests to 127.0.0.1 never go through the proxy an http_proxy variable names.
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class PrometheusError(RuntimeError):
    """Prometheus rejected a request, or did not answer it."""


def prometheus_binary() -> str:
    """Path of the prometheus binary: on PATH, else Debian's; fail the test if there is none."""
    found = shutil.which("prometheus") or shutil.which("prometheus", path="/usr/bin")
    if not found:
        pytest.fail(f"prometheus not found (/usr/bin/prometheus): {FIX}", pytrace=False)
    return found


class PrometheusServer(ServerProcess):
    """A Prometheus process that this process started, scraping static targets."""

    start_timeout = START_TIMEOUT
    stop_timeout = STOP_TIMEOUT
    poll_interval = POLL_INTERVAL
    error = PrometheusError

    def __init__(
        self,
        targets: list[str],
        base_dir: Path | None = None,
        job: str = JOB,
        scrape_interval: float = 1.0,
    ):
        super().__init__()
        self.targets_scraped = list(targets)
        self.job = job
        self.scrape_interval = scrape_interval
        self._own_dir = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="everystep-prometheus-"))
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.port: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.base_dir / "prometheus.log"

    @property
    def config_path(self) -> Path:
        return self.base_dir / "prometheus.yml"

    @property
    def where(self) -> str:
        return f"prometheus on port {self.port}"

    def __repr__(self) -> str:
        return f"<PrometheusServer {self.url} targets={self.targets_scraped} pid={self.pid}>"

    def __enter__(self) -> PrometheusServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        """Write the configuration, start the server and return once it is ready."""
        if self.pid is not None:
            return
        binary = prometheus_binary()
        self._write_config()
        self.port = free_port()
        command = [
            binary,
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.base_dir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]
        self.launch(command, cwd=self.base_dir)

    def stop(self) -> None:
        """Stop the server by PID: SIGTERM, wait up to 10 s, then SIGKILL. Idempotent.

        Removes the directory too when the server made it itself.
        """
        # A forked child inherits this object, but the server is its parent's.
        if not self.owned_here():
            return
        super().stop()
        if self._own_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def query(self, promql: str) -> list:
        """The result list of the instant query promql, evaluated now."""
        return self._api("query", {"query": promql})["result"]

    def targets(self) -> dict[str, dict]:
        """The active targets by instance: {"health": "up"|"down"|"unknown", "last_error": ...}."""
        data = self._api("targets", {"state": "active"})
        return {
            t["labels"].get("instance", t["scrapeUrl"]): {
                "health": t["health"],
                "last_error": t["lastError"],
                "last_scrape": t["lastScrape"],
                "job": t["labels"].get("job"),
            }
            for t in data["activeTargets"]
        }

    def wait_for(self, promql: str, predicate=None, timeout: float = 60.0) -> list:
        """Poll promql until its result is non-empty, or predicate(result) is true; return it.

        Fails the test once timeout seconds pass, or at once if the server exits.
        """
        deadline = time.monotonic() + timeout
        while True:
            self.check_alive()
            result = self.query(promql)
            if predicate(result) if predicate is not None else result:
                return result
            if time.monotonic() > deadline:
                break
            time.sleep(POLL_INTERVAL)
        try:
            health = self.targets()
        except PrometheusError as exc:
            health = f"(unknown: {exc})"
        condition = "" if predicate is None else " matching the predicate"
        pytest.fail(
            f"{self!r}: no result{condition} for {promql!r} after {timeout:.0f} s\n"
            f"last result: {json.dumps(result)}\n"
            f"targets: {json.dumps(health, indent=1)}\n"
            f"log {self.log_path}:\n{tail(self.log_path)}",
            pytrace=False,
        )

    @staticmethod
    def value(result: list) -> float:
        """The sample value of a result that holds exactly one series."""
        assert len(result) == 1, f"expected one series, got {result}"
        return float(result[0]["value"][1])

    def _write_config(self) -> None:
        # JSON is YAML: the configuration needs no YAML library.
        interval = f"{int(self.scrape_interval * 1000)}ms"
        config = {
            "global": {"scrape_interval": interval, "scrape_timeout": interval},
            "scrape_configs": [
                {
                    "job_name": self.job,
                    "metrics_path": "/metrics",
                    "static_configs": [{"targets": self.targets_scraped}],
                }
            ],
        }
        self.config_path.write_text(json.dumps(config, indent=2) + "\n")

    def _api(self, endpoint: str, params: dict) -> dict:
        """The data of an answer from /api/v1/<endpoint>; raise PrometheusError on an error."""
        url = f"{self.url}/api/v1/{endpoint}?{urllib.parse.urlencode(params)}"
        try:
            with _opener.open(url, timeout=REQUEST_TIMEOUT) as response:
                body = json.load(response)
        except urllib.error.HTTPError as exc:
            # Prometheus answers a bad query with 400 or 422 and a JSON error.
            try:
                body = json.load(exc)
            except ValueError:
                raise PrometheusError(f"{url}: HTTP {exc.code}") from None
        except (OSError, ValueError) as exc:
            raise PrometheusError(f"{url}: {exc}") from exc
        if body.get("status") != "success":
            raise PrometheusError(f"{url}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def ready(self) -> bool:
        """Whether /-/ready answers 200 (503 while the server starts)."""
        try:
            with _opener.open(f"{self.url}/-/ready", timeout=REQUEST_TIMEOUT) as response:
                return response.status == 200
        except (OSError, ValueError):
            return False  # not listening yet, or 503 while it starts


@pytest.fixture
def prometheus_server(tmp_path_factory):
    """Start Prometheus servers: ``prom = prometheus_server(["127.0.0.1:9123"])``
    (keyword arguments as for PrometheusServer). Each lives in a pytest
    temporary directory, which keeps its log; all are stopped at the end of
    the test."""
    started = []

    def start(targets, **kwargs):
        kwargs.setdefault("base_dir", tmp_path_factory.mktemp("prometheus"))
        server = PrometheusServer(targets, **kwargs)
        started.append(server)
        server.start()
        return server

    yield start
    for server in started:
        server.stop()
