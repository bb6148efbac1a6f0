"""A real ``everystep ui`` for the tests: started from the built zipapp
(`start_ui`, a fixture), and the clients that talk to it over real
sockets: a browser that keeps cookies (`Client`), and a Server-Sent Events
reader (`EventStream`)."""

import base64
import http.client
import http.cookiejar
import json
import re
import signal
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

import pytest

from tests.servers import free_port
from tests.zipapp import run_pyz, workflow_environment

STOP_DEADLINE = 10.0  # seconds from the signal to the exit


class UI:
    """One ``everystep ui`` process serving on `url`, behind `password`."""

    def __init__(self, process, url, password):
        self.process, self.url, self.password = process, url, password

    def client(self, *, basic=False, password=None, user="admin"):
        """A user agent for this UI; with `basic`, every request carries
        `user` and `password` (default: the right one) by basic auth."""
        auth = basic_auth(password or self.password, user) if basic else {}
        return Client(self.url, auth)

    def stream(self, query):
        """The live stream ``api/stream?QUERY``, opened with basic auth."""
        return EventStream(self.url, query, basic_auth(self.password))


@pytest.fixture
def start_ui(pyz, spawn_process, tmp_path):
    """``start_ui(*flags, env=None, **variables)``: start ``everystep.pyz ui``
    on a free port with a fresh password, in a scratch directory, on the
    test database; wait for its serving line and return the `UI`. The
    process is killed by its PID at the end of the test if still alive."""

    def start(*flags, env=None, **variables):
        password = "pw-" + uuid.uuid4().hex
        port = free_port()
        env = env or workflow_environment(**variables)
        env.setdefault("EVERYSTEP_UI_PASSWORD", password)
        command = [str(pyz), "ui", "--port", str(port), *flags]
        process = spawn_process("ui", command, env=env, cwd=tmp_path)
        process.wait_for_log(f"operator UI serving on http://127.0.0.1:{port}/")
        return UI(process, f"http://127.0.0.1:{port}", env["EVERYSTEP_UI_PASSWORD"])

    return start


def basic_auth(password, user="admin"):
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


class Response:
    def __init__(self, status, headers, body):
        self.status, self.headers, self.body = status, headers, body

    @property
    def text(self):
        return self.body.decode()

    def json(self):
        return json.loads(self.body)


class NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


class Client:
    """A browser's part that matters here: it keeps cookies, shows each
    redirect rather than following it, and may send basic auth."""

    def __init__(self, base_url, headers):
        self.base_url = base_url
        self.cookies = http.cookiejar.CookieJar()
        self.headers = headers
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(self.cookies), NoRedirects
        )

    def get(self, path):
        return self._send(urllib.request.Request(self.base_url + path, headers=self.headers))

    def post(self, path, fields):
        data = urllib.parse.urlencode(fields).encode()
        return self._send(urllib.request.Request(self.base_url + path, data, self.headers))

    def form(self, path):
        """GET the page at `path` and return it with the CSRF token of its
        form (whose cookie the client now holds)."""
        page = self.get(path)
        assert page.status == 200, (path, page.status, page.text)
        found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
        assert found, f"no form with a CSRF token on {path}"
        assert any(cookie.name == "everystep_csrftoken" for cookie in self.cookies)
        return page.text, found.group(1)

    def _send(self, request):
        try:
            with self.opener.open(request, timeout=15) as answer:
                return Response(answer.status, answer.headers, answer.read())
        except urllib.error.HTTPError as answer:
            return Response(answer.code, answer.headers, answer.read())


class EventStream:
    """A Server-Sent Events stream read line by line, each read bounded by
    what is left of its deadline."""

    def __init__(self, base_url, query, headers):
        parts = urllib.parse.urlsplit(base_url)
        self.connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=15)
        self.connection.request("GET", f"/api/stream?{query}", headers=headers)
        self.socket = self.connection.sock  # the connection lets go of it for a streamed body
        self.response = self.connection.getresponse()
        assert self.response.status == 200, self.response.read()
        assert self.response.headers["Content-Type"].startswith("text/event-stream")

    def next_event(self, kind, timeout, containing=""):
        """The data of the next `kind` event whose data contains `containing`;
        fail if none comes within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        fields = {}
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"no {kind!r} event with {containing!r} within {timeout}s")
            self.socket.settimeout(left)
            try:
                line = self.response.readline()
            except TimeoutError:
                continue  # the deadline check above fails the test
            if not line:
                pytest.fail(f"the stream ended before a {kind!r} event with {containing!r}")
            line = line.decode().rstrip("\r\n")
            if line:
                name, _, value = line.partition(":")
                fields[name] = value.removeprefix(" ")
                continue
            if fields.get("event") == kind and containing in fields.get("data", ""):
                return fields["data"]
            fields = {}

    def rest(self, timeout):
        """Everything the server still sends, until it ends the stream."""
        self.socket.settimeout(timeout)
        return self.response.read()

    def close(self):
        self.connection.close()


def stop(ui, sig=signal.SIGTERM):
    """Send `sig` to the UI by its PID; return (exit status, seconds to exit)."""
    began = time.monotonic()
    ui.process.send(sig)
    code = ui.process.wait(STOP_DEADLINE + 20)
    return code, time.monotonic() - began


def run_ui(pyz, tmp_path, *flags, **variables):
    """Run ``everystep.pyz ui FLAGS`` to its exit (which it should reach at once)."""
    env = workflow_environment(**{"EVERYSTEP_UI_PASSWORD": "a-long-enough-password", **variables})
    return run_pyz(pyz, "ui", *flags, env=env, cwd=tmp_path, timeout=60)
