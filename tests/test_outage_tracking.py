"""One outage is announced once (§10): a connection cut off by it that
fails only after the database came back is the outage's tail, not a new one."""

import threading

import pytest
from django.db import InterfaceError, connection, connections, transaction

from everystep.core import events
from everystep.resilience import deadline, outage, sessions, transient
from tests.helpers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def announced():
    seen = []

    def keep(event, fields):
        if event in ("db_outage", "db_recovered"):
            seen.append(event)

    events.subscribe(keep)
    yield seen
    events.unsubscribe(keep)


def opened_connection():
    wrapper = connections.create_connection("default")
    wrapper.ensure_connection()
    return wrapper


def test_a_connection_opened_before_an_outage_failing_after_it_is_no_new_outage(announced):
    tracker = outage.Outage()
    tracker.generation = outage.tracker.generation  # the generation connections open in now
    cut_off = opened_connection()
    lost = InterfaceError("connection already closed")
    try:
        tracker.failed("claiming runs", lost, outage.generation_of(cut_off))
        tracker.succeeded()
        # The same outage cut this one off; its deadline ran out after the heal.
        tracker.failed("recording step 1", lost, outage.generation_of(cut_off))
        assert announced == ["db_outage", "db_recovered"]
        assert tracker.since is None

        # A connection opened since then that fails is a new outage.
        outage.tracker.generation, saved = tracker.generation, outage.tracker.generation
        try:
            fresh = opened_connection()
        finally:
            outage.tracker.generation = saved
        tracker.failed("recording step 2", lost, outage.generation_of(fresh))
        assert announced == ["db_outage", "db_recovered", "db_outage"]
        fresh.close()
    finally:
        cut_off.close()


_SLEEP_SQL = {"postgresql": "SELECT pg_sleep(60)", "mysql": "SELECT SLEEP(60)"}


@pytest.mark.backends("postgres", "mariadb")
def test_an_operation_cut_off_by_an_outage_is_its_tail_even_when_django_reconnects_on_the_way_out(
    announced, monkeypatch
):
    """A claim blocked in its transaction when an outage began fails only
    once the deadline gives its connection up, after the database came back.
    Leaving the broken transaction, Django reconnects on its own: the failure
    then surfaces on a connection opened after the outage, and is still no
    new outage."""
    tracker = outage.Outage()
    tracker.generation = outage.tracker.generation
    monkeypatch.setattr(outage, "tracker", tracker)  # connections are stamped with its generation
    blocked = threading.Event()
    held = {}
    outcome = {}

    def claim(attempt):
        if attempt == 1:
            held["wrapper"] = connections["default"]
            with transaction.atomic():
                with connection.cursor() as cursor:
                    blocked.set()
                    cursor.execute(_SLEEP_SQL[connection.vendor])
        return attempt

    def claimer():
        try:
            outcome["attempts"] = transient.retrying(claim, what="claiming runs")
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            outcome["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=claimer)
    thread.start()
    try:
        wait_until(blocked.is_set, timeout=10, message="the claim under way")
        # Another thread meets the outage first, and the database comes back.
        tracker.failed("recording step 1", InterfaceError("cut off"), tracker.generation)
        tracker.succeeded()
        # Only now does the deadline give the claim's connection up.
        deadline.shut_down(held["wrapper"])
        thread.join(timeout=30)
    finally:
        if thread.is_alive():
            deadline.shut_down(held["wrapper"])
            thread.join(timeout=30)
        # The cut-off session still sleeps on the server, as a worker's would.
        sessions.end_abandoned(connections["default"])
    assert outcome == {"attempts": 2}
    assert announced == ["db_outage", "db_recovered"], "the outage's tail announced a new outage"
    assert tracker.since is None
