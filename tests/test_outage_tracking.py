"""One outage is announced once (§10): a connection cut off by it that
fails only after the database came back is the outage's tail, not a new one."""

import pytest
from django.db import InterfaceError, connections

from everystep import events, transient

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
    tracker = transient._Outage()
    tracker.generation = transient.outage.generation  # the generation connections open in now
    cut_off = opened_connection()
    lost = InterfaceError("connection already closed")
    try:
        tracker.failed("claiming runs", lost, cut_off)
        tracker.succeeded()
        # The same outage cut this one off; its deadline ran out after the heal.
        tracker.failed("recording step 1", lost, cut_off)
        assert announced == ["db_outage", "db_recovered"]
        assert tracker.since is None

        # A connection opened since then that fails is a new outage.
        transient.outage.generation, saved = tracker.generation, transient.outage.generation
        try:
            fresh = opened_connection()
        finally:
            transient.outage.generation = saved
        tracker.failed("recording step 2", lost, fresh)
        assert announced == ["db_outage", "db_recovered", "db_outage"]
        fresh.close()
    finally:
        cut_off.close()
