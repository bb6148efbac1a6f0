"""Database settings from a URL: PostgreSQL prepares the statements a
worker repeats for every step, unless the URL turns it off for a pooler."""

import pytest
from django.db import connection
from everystep_config.database import DatabaseURLError, database_settings

from tests import workflows
from tests.helpers import run_to_end

URL = "postgres://everystep@127.0.0.1:5432/everystep"


def test_postgres_statements_are_prepared_by_default():
    options = database_settings(URL)["OPTIONS"]
    assert options["server_side_binding"] is True
    assert options["prepare_threshold"] == 5


def test_the_url_can_turn_prepared_statements_off_or_tune_them():
    def threshold(query):
        return database_settings(URL + query)["OPTIONS"]["prepare_threshold"]

    assert threshold("?prepare_threshold=none") is None
    assert threshold("?prepare_threshold=1") == 1


def test_a_bad_prepare_threshold_is_refused():
    with pytest.raises(DatabaseURLError, match="prepare_threshold"):
        database_settings(URL + "?prepare_threshold=soon")


@pytest.mark.backends("postgres")
@pytest.mark.django_db(transaction=True)
def test_a_run_of_many_steps_uses_prepared_statements_on_postgres():
    run = run_to_end(workflows.echo_values, *range(12))
    assert run.status == "completed"
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        prepared = [row[0] for row in cursor.fetchall()]
    assert any("everystep_step" in statement for statement in prepared), prepared
