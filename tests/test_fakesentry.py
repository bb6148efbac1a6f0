"""The fake Sentry receives what the real sentry-sdk sends over HTTP: the
SDK's own client and transport, in this process and in a subprocess that
reads SENTRY_DSN, deliver to it. No database is involved."""

import gzip
import http.client
import json
import os
import subprocess
import sys

import pytest
import sentry_sdk

from tests.fakesentry import FakeSentry, fake_sentry, parse_envelope  # noqa: F401


@pytest.fixture
def sentry(fake_sentry):  # noqa: F811
    """Initialize the real sentry-sdk in this process: ``sentry(dsn)``; flush,
    close and shut it down at the end (before the fake closes)."""

    def init(dsn):
        sentry_sdk.init(dsn=dsn)

    yield init
    client = sentry_sdk.get_client()
    client.flush(timeout=10)
    client.close()
    sentry_sdk.init(dsn=None)


def test_an_exception_arrives_with_its_context_and_tags(fake_sentry, sentry):  # noqa: F811
    sentry(fake_sentry.dsn)
    with sentry_sdk.new_scope() as scope:
        scope.set_context("workflow", {"run_id": 42, "name": "orders.ship"})
        scope.set_tag("everystep.worker", "worker-1")
        try:
            raise ValueError("the step failed")
        except ValueError:
            event_id = sentry_sdk.capture_exception()
    sentry_sdk.flush(timeout=10)

    events = fake_sentry.wait_for_events(1)
    assert len(events) == 1, events
    event = events[0]
    assert event["event_id"] == event_id
    exception = event["exception"]["values"][-1]
    assert (exception["type"], exception["value"]) == ("ValueError", "the step failed")
    assert event["contexts"]["workflow"] == {"run_id": 42, "name": "orders.ship"}
    assert event["tags"] == {"everystep.worker": "worker-1"}
    assert "event" in fake_sentry.item_types
    assert fake_sentry.rejected == []


def test_a_subprocess_reports_through_SENTRY_DSN(fake_sentry):  # noqa: F811
    script = "\n".join(
        [
            "import os, sentry_sdk",
            "sentry_sdk.init(dsn=os.environ['SENTRY_DSN'])",
            "sentry_sdk.set_tag('everystep.worker', 'subprocess')",
            "try:",
            "    1 / 0",
            "except ZeroDivisionError:",
            "    sentry_sdk.capture_exception()",
            "sentry_sdk.capture_message('the worker stopped')",
            "sentry_sdk.flush(timeout=10)",
        ]
    )
    env = {**os.environ, "SENTRY_DSN": fake_sentry.dsn}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr

    events = fake_sentry.wait_for_events(2)
    assert len(events) == 2, events
    error, message = events
    assert error["exception"]["values"][-1]["type"] == "ZeroDivisionError"
    assert message["message"] == "the worker stopped"
    assert all(e["tags"] == {"everystep.worker": "subprocess"} for e in events)
    assert fake_sentry.rejected == []


def test_a_wrong_key_is_rejected_and_shown_by_a_failed_wait(fake_sentry, sentry):  # noqa: F811
    sentry(fake_sentry.dsn.replace("//public@", "//other@"))
    sentry_sdk.capture_message("to the wrong key")
    sentry_sdk.flush(timeout=10)

    assert fake_sentry.events == []
    # The event's envelope, then the SDK's client report of the event it lost.
    assert fake_sentry.rejected
    for line in fake_sentry.rejected:
        assert line.startswith("403 POST /api/1/envelope/: sentry_key 'other'"), line
    with pytest.raises(pytest.fail.Exception, match="received 0.*sentry_key 'other'"):
        fake_sentry.wait_for_events(1, timeout=0.1)


def test_an_envelope_is_parsed_by_lengths_and_lines(fake_sentry):  # noqa: F811
    event = {"event_id": "e" * 32, "message": "two\nlines"}
    payload = json.dumps(event, indent=1).encode()  # holds newlines: needs its length
    body = b"\n".join(
        [
            json.dumps({"event_id": event["event_id"]}).encode(),
            json.dumps({"type": "event", "length": len(payload)}).encode(),
            payload,
            json.dumps({"type": "client_report"}).encode(),  # no length: up to the newline
            b'{"discarded_events": []}',
            b"",
        ]
    )
    header, items = parse_envelope(body)
    assert header == {"event_id": event["event_id"]}
    assert [(h["type"], json.loads(p)) for h, p in items] == [
        ("event", event),
        ("client_report", {"discarded_events": []}),
    ]

    connection = http.client.HTTPConnection("127.0.0.1", fake_sentry.port, timeout=10)
    try:
        connection.request(
            "POST",
            "/api/1/envelope/?sentry_key=public",
            gzip.compress(body),
            {"Content-Encoding": "gzip", "Content-Type": "application/x-sentry-envelope"},
        )
        response = connection.getresponse()
        assert (response.status, response.read()) == (200, b"{}")
    finally:
        connection.close()
    assert fake_sentry.wait_for_events(1) == [event]
    assert fake_sentry.item_types == ["event", "client_report"]


def test_close_releases_the_port():
    fake = FakeSentry()
    fake.close()
    fake.close()
    with pytest.raises(OSError):
        http.client.HTTPConnection("127.0.0.1", fake.port, timeout=5).connect()
