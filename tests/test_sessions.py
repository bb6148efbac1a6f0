"""Sessions left on the server by connections the engine gave up on are
ended once the database answers (§10): only those, and only while their id
cannot name someone else's session."""

import pytest
from django.db import connection, connections

from everystep.resilience import sessions
from tests.helpers import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.backends("postgres", "mariadb")]


def session_alive(session):
    if connection.vendor == "postgresql":
        sql = "SELECT count(*) FROM pg_stat_activity WHERE pid = %s"
    else:
        sql = "SELECT count(*) FROM information_schema.processlist WHERE id = %s"
    with connection.cursor() as cursor:
        cursor.execute(sql, [session])
        return cursor.fetchone()[0] == 1


@pytest.fixture
def other_connection():
    """A second connection to the test database, as a worker thread has."""
    sessions.note_server(connection)  # as a worker does when it starts
    wrapper = connections.create_connection("default")
    wrapper.ensure_connection()
    yield wrapper
    wrapper.close()


@pytest.fixture(autouse=True)
def nothing_remembered(monkeypatch):
    monkeypatch.setattr(sessions, "_abandoned", {})
    monkeypatch.setattr(sessions, "_server", None)


def test_an_abandoned_session_still_on_the_server_is_ended(other_connection):
    ((session, _),) = sessions.noted(other_connection).sessions
    sessions.abandon(other_connection)
    assert sessions.pending()

    assert sessions.end_abandoned(connection) == 1
    wait_until(lambda: not session_alive(session), 10, message="the session to end")
    assert not sessions.pending()


def test_a_session_closed_properly_is_not_remembered(other_connection):
    sessions.forget(other_connection)
    sessions.abandon(other_connection)
    assert not sessions.pending()


def test_a_session_is_remembered_once(other_connection):
    sessions.abandon(other_connection)
    assert sessions.end_abandoned(connection) == 1
    sessions.abandon(other_connection)
    assert not sessions.pending()


def test_a_session_younger_than_the_connection_that_was_abandoned_is_not_ended(
    other_connection,
):
    """An id reused by a session that opened after ours (a PostgreSQL pid, a
    MariaDB connection id after a restart) names someone else's session."""
    noted = sessions.noted(other_connection).sessions
    ((session, opened_at),) = noted
    noted[0] = (session, opened_at - 3600)  # opened an hour ago
    sessions.abandon(other_connection)

    assert sessions.end_abandoned(connection) == 0
    assert session_alive(session)
    assert not sessions.pending()


def test_sessions_opened_before_the_server_changed_are_not_ended(other_connection, monkeypatch):
    """After a failover or a restart behind the same URL, an id noted before
    may name another session on the new server."""
    ((session, _),) = sessions.noted(other_connection).sessions
    sessions.abandon(other_connection)
    monkeypatch.setattr(sessions, "_server", ("the server before a failover", 0.0))

    assert sessions.end_abandoned(connection) == 0
    assert session_alive(session)
    assert not sessions.pending()


@pytest.mark.backends("postgres")
def test_statements_wait_unprepared_until_the_server_is_found_direct():
    """A worker prepares nothing until it has looked for a pooler; found
    none, its database's own prepare_threshold is back, on its open
    connection and on those it opens after."""
    connection.ensure_connection()
    own = connection.settings_dict["OPTIONS"].get("prepare_threshold")
    sessions.hold_prepared(connection)
    try:
        assert connection.connection.prepare_threshold is None
        assert (
            connections.create_connection("default").settings_dict["OPTIONS"]["prepare_threshold"]
            is None
        )
        sessions.note_server(connection)
    finally:
        sessions.release_prepared(connection)  # whatever happened above
    assert connection.settings_dict["OPTIONS"].get("prepare_threshold") == own
    assert connection.connection.prepare_threshold == (
        own if "prepare_threshold" in connection.settings_dict["OPTIONS"] else 5
    )
