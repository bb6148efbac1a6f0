"""Database settings from a URL: PostgreSQL prepares the statements a
worker repeats for every step, unless the URL turns it off for a pooler; a
URL that cannot work is refused when read; printed, its passwords are masked."""

import pytest
from django.db import connection
from everystep_config.database import (
    DatabaseURLError,
    database_settings,
    masked_url,
    url_secrets,
)

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


@pytest.mark.parametrize(
    "url, message",
    [
        ("postgres://", "names no database"),
        ("mariadb://127.0.0.1", "names no database"),
        ("sqlite:///no/such/dir/db.sqlite3", "/no/such/dir for the SQLite file does not exist"),
        (URL + "?sslmode=bogus", "disable, allow, prefer, require, verify-ca, verify-full"),
        (URL + "?keepalives=1&colour=blue", "unknown PostgreSQL connection option 'colour'"),
    ],
)
def test_an_unusable_url_is_refused_when_read(url, message):
    with pytest.raises(DatabaseURLError, match=message):
        database_settings(url)


def test_libpq_django_and_psycopg_options_are_accepted(tmp_path):
    query = (
        "?sslmode=verify-full&keepalives=0&application_name=x&currentSchema=s"
        "&server_side_binding=false&prepare_threshold=none&service=svc"
    )
    options = database_settings(URL + query)["OPTIONS"]
    assert options["sslmode"] == "verify-full" and options["server_side_binding"] is False
    assert database_settings("postgres:///?service=svc")["OPTIONS"]["service"] == "svc"
    assert database_settings(f"sqlite:///{tmp_path}/db.sqlite3")["NAME"].startswith(str(tmp_path))


def test_every_password_of_a_url_is_masked():
    url = "postgres://me:p%40ss@h/db?sslmode=require&password=s3cret&SSLPassword=k+y"
    assert masked_url(url) == "postgres://me:***@h/db?sslmode=require&password=***&SSLPassword=***"
    assert {"p@ss", "s3cret", "k y"} <= url_secrets(url)
    assert masked_url(URL) == URL and url_secrets(URL) == set()


@pytest.mark.backends("postgres")
@pytest.mark.django_db(transaction=True)
def test_a_run_of_many_steps_uses_prepared_statements_on_postgres():
    run = run_to_end(workflows.echo_values, *range(12))
    assert run.status == "completed"
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        prepared = [row[0] for row in cursor.fetchall()]
    assert any("everystep_step" in statement for statement in prepared), prepared
