"""The engine's own statements on PostgreSQL go through libpq itself
(`everystep.db.libpq`): each is prepared once per connection after the
connection's ``prepare_threshold`` runs, and reads and writes its values as
psycopg's cursor does. A statement dropped from the session is prepared
again, one past the cap is sent unnamed, one in a caller's transaction
stays in it, a failure raises what the cursor raises, and behind PgBouncer
(no named statements) every statement is unnamed."""

import datetime
import uuid

import pytest
from django.db import IntegrityError, OperationalError, connection, transaction

from everystep.db import libpq, sql
from everystep.models import Queue
from everystep.resilience import classify, deadline
from tests import workflows
from tests.helpers import recorded_steps, run_to_end

pytestmark = [
    pytest.mark.backends("postgres", "pgbouncer"),
    pytest.mark.django_db(transaction=True),
]


def prepared_by_the_engine():
    """The names of the statements the engine prepared on this connection."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM pg_prepared_statements WHERE name LIKE 'everystep%%'")
        return {name for (name,) in cursor.fetchall()}


def test_values_read_and_written_as_the_cursor_reads_and_writes_them():
    run_id, now = uuid.uuid4(), datetime.datetime.now(datetime.UTC)
    rows = sql.fetch(
        connection,
        "SELECT %(n)s::int + %(n)s::int, %(id)s, %(at)s, %(text)s::jsonb, '100%%', %(none)s::text",
        {"n": 2, "id": run_id, "at": now, "text": '{"a": [1]}', "none": None},
    )
    assert rows == [(4, run_id, now, '{"a": [1]}', "100%", None)]


@pytest.mark.backends("postgres")
def test_a_run_prepares_its_statements_and_runs_again_once_they_are_dropped():
    run = run_to_end(workflows.echo_values, *range(12))  # more than the threshold's 5
    assert run.status == "completed"
    prepared = prepared_by_the_engine()
    assert prepared, "the step's statement was not prepared"
    with connection.cursor() as cursor:
        for name in prepared:
            cursor.execute(f"DEALLOCATE {name}")
    again = run_to_end(workflows.echo_values, *range(100, 112))
    assert again.status == "completed"
    assert [result for _, _, result in recorded_steps(again).values()] == [*range(100, 112)]
    assert prepared_by_the_engine() == prepared


@pytest.mark.backends("postgres")
def test_nothing_is_prepared_on_a_connection_with_client_side_binding():
    options = {**connection.settings_dict["OPTIONS"], "server_side_binding": False}
    client_side = connection.copy()
    client_side.settings_dict = {**connection.settings_dict, "OPTIONS": options}
    try:
        for n in range(12):  # more than the threshold's 5
            insert = "INSERT INTO everystep_queue (name, declared_at) VALUES (%s, now())"
            assert sql.execute(client_side, insert, [f"queue {n}"]) == 1
        with client_side.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_prepared_statements")
            assert cursor.fetchone() == (0,)
    finally:
        client_side.close()
    assert Queue.objects.count() == 12


@pytest.mark.backends("postgres")
def test_statements_past_the_cap_are_sent_unnamed(monkeypatch):
    connection.close()  # a new connection, with nothing prepared yet
    monkeypatch.setattr(libpq, "MAX_PREPARED", 0)
    run = run_to_end(workflows.echo_values, *range(12))
    assert run.status == "completed"
    assert prepared_by_the_engine() == set()


def test_a_failed_statement_raises_what_the_cursor_raises():
    Queue.objects.create(name="twice")
    insert = "INSERT INTO everystep_queue (name, declared_at) VALUES (%s, now())"
    with pytest.raises(IntegrityError, match="duplicate key"):
        sql.execute(connection, insert, ["twice"])
    deadline.shut_down(connection)  # as the watchdog gives up a silent database
    with pytest.raises(OperationalError) as lost:
        sql.execute(connection, insert, ["after"])
    assert classify.is_transient(lost.value)
    connection.close()
    assert sql.execute(connection, insert, ["after"]) == 1


def test_a_statement_in_a_callers_transaction_rolls_back_with_it():
    insert = "INSERT INTO everystep_queue (name, declared_at) VALUES (%s, now())"
    with pytest.raises(RuntimeError), transaction.atomic():
        sql.execute(connection, insert, ["first in the transaction"])
        raise RuntimeError("the view failed")
    with pytest.raises(RuntimeError), transaction.atomic():
        Queue.objects.exists()  # the transaction has begun on the server
        sql.execute(connection, insert, ["after a query"])
        raise RuntimeError("the view failed")
    assert not Queue.objects.exists()
