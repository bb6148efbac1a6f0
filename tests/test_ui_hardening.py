"""The standalone operator UI tried the way an attacker would: guessing its
password, holding its connections, sending what no form sends, copying a
session's cookie, writing into its audit log. Each test runs a real
``everystep.pyz ui`` and talks to it over real sockets."""

import http.client
import re
import socket
import time
import urllib.parse

import pytest

from everystep.models import Workflow
from tests.helpers import wait_until
from tests.uiprocess import basic_auth, run_ui, stop
from tests.zipapp import one_line_error

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.backends("sqlite")]


def request(ui, method, path, *, headers=None, body=None, source="127.0.0.1"):
    """One request from the loopback address `source` (a client of its own,
    as the UI tells clients apart); returns (status, headers, body)."""
    parts = urllib.parse.urlsplit(ui.url)
    connection = http.client.HTTPConnection(
        parts.hostname, parts.port, timeout=15, source_address=(source, 0)
    )
    try:
        connection.request(method, path, body=body, headers=headers or {})
        answer = connection.getresponse()
        return answer.status, answer.headers, answer.read()
    finally:
        connection.close()


def test_a_password_shorter_than_12_characters_is_refused(pyz, tmp_path):
    result = run_ui(pyz, tmp_path, EVERYSTEP_UI_PASSWORD="hunter2")
    assert result.returncode == 2
    assert one_line_error(result) == (
        "everystep: error: EVERYSTEP_UI_PASSWORD is 7 characters long: the operator UI needs "
        "at least 12 (a phrase of a few words will do)"
    )


def test_guessing_the_password_is_throttled_per_client_and_overall_and_logged(start_ui):
    """Five wrong passwords from one client, and that client is refused
    (429) even with the right one, while another client still gets in;
    thirty from many, and everyone is refused. Each failure is logged."""
    ui = start_ui()
    wrong = basic_auth("not-the-password")
    for _ in range(5):
        assert request(ui, "GET", "/api/runs", headers=wrong)[0] == 401
    status, headers, _ = request(ui, "GET", "/api/runs", headers=basic_auth(ui.password))
    assert status == 429 and 1 <= int(headers["Retry-After"]) <= 60
    right = basic_auth(ui.password)
    assert request(ui, "GET", "/api/runs", headers=right, source="127.0.0.2")[0] == 200

    for client in range(3, 8):  # five more clients, five failures each: 30 in all
        for _ in range(5):
            source = f"127.0.0.{client}"
            assert request(ui, "GET", "/api/runs", headers=wrong, source=source)[0] == 401
    assert request(ui, "GET", "/api/runs", headers=right, source="127.0.0.9")[0] == 429
    page = request(ui, "POST", "/login", body=b"password=x", source="127.0.0.10")
    assert page[0] in (403, 429)  # no CSRF token: refused before any password is checked

    log = ui.process.log()
    assert log.count("failed login to the operator UI from 127.0.0.1 by basic auth") == 5
    assert ui.password not in log and "not-the-password" not in log


def test_the_server_refuses_large_bodies_drops_idle_connections_and_stays_reachable(start_ui):
    """A body larger than any form is refused before any view runs; 150
    half-sent requests neither fill the server nor stay open."""
    ui = start_ui()
    parts = urllib.parse.urlsplit(ui.url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        # A body of 5 MiB announced: refused on its length, before it is read.
        sock.sendall(
            b"POST /login HTTP/1.1\r\nHost: x\r\nContent-Length: 5242880\r\n"
            b"Content-Type: application/x-www-form-urlencoded\r\n\r\n" + b"x" * 65536
        )
        assert sock.recv(64).startswith(b"HTTP/1.1 413 "), "a large body was not refused"

    parts = urllib.parse.urlsplit(ui.url)
    half_sent = []
    try:
        for _ in range(150):
            sock = socket.create_connection((parts.hostname, parts.port), timeout=5)
            sock.sendall(b"GET /api/runs HTTP/1.1\r\nHost: x\r\n")  # and never the end
            half_sent.append(sock)
        began = time.monotonic()
        assert request(ui, "GET", "/api/runs", headers=basic_auth(ui.password))[0] == 200
        assert time.monotonic() - began < 5

        def dropped():
            return all(_closed_by_server(sock) for sock in half_sent)

        wait_until(dropped, timeout=40, message="the half-sent requests dropped")
    finally:
        for sock in half_sent:
            sock.close()


def _closed_by_server(sock):
    sock.settimeout(0.01)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


def test_live_streams_are_capped_below_the_threads_and_the_next_page_polls(start_ui):
    """Eight streams hold eight of the sixteen threads; a ninth is refused
    with 503, which sends its page to polling, and the UI still answers.
    A stream that ends gives its place back."""
    ui = start_ui()
    streams = [ui.stream("view=workers") for _ in range(8)]
    try:
        status, _, body = request(
            ui, "GET", "/api/stream?view=workers", headers=basic_auth(ui.password)
        )
        assert status == 503 and b"poll" in body
        assert request(ui, "GET", "/api/runs", headers=basic_auth(ui.password))[0] == 200
        streams.pop().close()

        def reopened():
            try:
                return ui.stream("view=workers")
            except AssertionError:  # still 503: the server has not seen the close yet
                return None

        streams.append(wait_until(reopened, timeout=15, message="the cap making room"))
    finally:
        for stream in streams:
            stream.close()


def _sign_in(ui, source="127.0.0.1", headers=None):
    """Sign in with the login form; returns the session cookie's header."""
    status, answer, body = request(ui, "GET", "/login", headers=headers, source=source)
    token = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', body).group(1).decode()
    csrf = re.search(r"everystep_csrftoken=([^;]+)", answer["Set-Cookie"]).group(1)
    form = urllib.parse.urlencode(
        {"csrfmiddlewaretoken": token, "username": "admin", "password": ui.password}
    )
    status, answer, _ = request(
        ui,
        "POST",
        "/login",
        body=form,
        headers={
            "Content-Type": "application/x-www-form-urlencoded",
            "Cookie": f"everystep_csrftoken={csrf}",
            "Referer": ui.url + "/login",
            **(headers or {}),
        },
        source=source,
    )
    assert status == 302, status
    cookie = [c for c in answer.get_all("Set-Cookie") if c.startswith("everystep_session=")]
    return cookie[0], csrf


def test_a_session_lasts_12_hours_and_ends_for_good_at_sign_out(start_ui):
    """A copied session cookie is worth nothing once its session signed out."""
    ui = start_ui()
    set_cookie, csrf = _sign_in(ui)
    assert "Max-Age=43200" in set_cookie and "HttpOnly" in set_cookie
    assert "Secure" not in set_cookie  # plain HTTP: a Secure cookie would never come back
    session = set_cookie.split(";")[0]
    cookies = {"Cookie": f"{session}; everystep_csrftoken={csrf}"}
    assert request(ui, "GET", "/workers", headers=cookies)[0] == 200

    page = request(ui, "GET", "/workers", headers=cookies)[2].decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    signed_out = request(
        ui,
        "POST",
        "/logout",
        body=urllib.parse.urlencode({"csrfmiddlewaretoken": token}),
        headers={
            **cookies,
            "Content-Type": "application/x-www-form-urlencoded",
            "Referer": ui.url + "/workers",
        },
    )
    assert signed_out[0] == 302
    assert request(ui, "GET", "/workers", headers=cookies)[0] == 302  # to the login form


def test_behind_a_trusted_proxy_that_ends_tls_the_cookies_are_secure(start_ui):
    """The proxy says the browser came over TLS: the session and CSRF
    cookies are then only ever sent back over TLS, and sign-ins are counted
    per client the proxy names. Said by anyone else, it is ignored."""
    tls = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.7"}
    untrusted = start_ui()
    assert "Secure" not in request(untrusted, "GET", "/login", headers=tls)[1]["Set-Cookie"]

    ui = start_ui(EVERYSTEP_UI_TRUSTED_PROXY="127.0.0.1")
    status, answer, _ = request(ui, "GET", "/login", headers=tls)
    assert status == 200 and "Secure" in answer["Set-Cookie"]
    wrong = {**tls, **basic_auth("not-the-password")}
    assert request(ui, "GET", "/api/runs", headers=wrong)[0] == 401
    ui.process.wait_for_log("failed login to the operator UI from 203.0.113.7 by basic auth")


def test_a_session_from_before_a_password_change_is_signed_out(start_ui):
    ui = start_ui(EVERYSTEP_UI_SECRET_KEY="a-key-kept-across-restarts-" + "x" * 30)
    set_cookie, csrf = _sign_in(ui)
    cookies = {"Cookie": f"{set_cookie.split(';')[0]}; everystep_csrftoken={csrf}"}
    assert request(ui, "GET", "/workers", headers=cookies)[0] == 200
    assert stop(ui)[0] == 0

    changed = start_ui(
        EVERYSTEP_UI_SECRET_KEY="a-key-kept-across-restarts-" + "x" * 30,
        EVERYSTEP_UI_PASSWORD="a-new-and-longer-password",
    )
    assert request(changed, "GET", "/workers", headers=cookies)[0] == 302


def test_every_answer_carries_a_content_security_policy(start_ui):
    ui = start_ui()
    auth = basic_auth(ui.password)
    for path in ("/", "/login", "/api/runs", "/assets/ui.js", "/run/nonsense"):
        _, headers, _ = request(ui, "GET", path, headers=auth)
        policy = headers["Content-Security-Policy"]
        assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy, path
        assert "unsafe-inline" not in policy
        assert headers["X-Content-Type-Options"] == "nosniff"


def test_a_line_break_in_a_form_cannot_forge_an_audit_line(start_ui):
    ui = start_ui()
    set_cookie, csrf = _sign_in(ui)
    cookies = {"Cookie": f"{set_cookie.split(';')[0]}; everystep_csrftoken={csrf}"}
    page = request(ui, "GET", "/workers", headers=cookies)[2].decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    forged = "gone\n2026-12-05T00:00:00.000+00:00 INFO    everystep.ui: run 1: cancelled by eve"
    status, _, _ = request(
        ui,
        "POST",
        "/workers/requeue",
        body=urllib.parse.urlencode({"csrfmiddlewaretoken": token, "worker": forged}),
        headers={
            **cookies,
            "Content-Type": "application/x-www-form-urlencoded",
            "Referer": ui.url + "/workers",
        },
    )
    assert status == 303 or status == 302
    ui.process.wait_for_log("requeued by admin")
    log = ui.process.log()
    assert not re.search(r"^2026-12-05T00:00:00\.000", log, re.M), log
    assert "worker gone\\n2026-12-05T00:00:00.000+00:00" in log


def test_a_number_too_long_for_python_in_a_resolution_is_refused_not_a_500(start_ui):
    blocked = Workflow.objects.create(name="tests.workflows.pay", args=[1], status="blocked")
    blocked.steps.create(step_id="1", name="tests.workflows.charge", status="started")
    ui = start_ui()
    set_cookie, csrf = _sign_in(ui)
    cookies = {"Cookie": f"{set_cookie.split(';')[0]}; everystep_csrftoken={csrf}"}
    page = request(ui, "GET", f"/run/{blocked.id}", headers=cookies)[2].decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    form = {"csrfmiddlewaretoken": token, "step_id": "1", "how": "result", "result": "9" * 5000}
    status, _, body = request(
        ui,
        "POST",
        f"/run/{blocked.id}/resolve",
        body=urllib.parse.urlencode(form),
        headers={
            **cookies,
            "Content-Type": "application/x-www-form-urlencoded",
            "Referer": f"{ui.url}/run/{blocked.id}",
        },
    )
    assert status == 400, body[:300]
    assert b"not valid JSON" in body
    blocked.refresh_from_db()
    assert blocked.status == "blocked"
