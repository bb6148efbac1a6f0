"""Workers behind a connection pooler: PgBouncer in transaction mode, in
front of the test PostgreSQL, as platforms put one in front of theirs.

A worker's claims and step writes go through the pooler, each transaction
on whichever server session is free. Its name lock and LISTEN need a
session of their own: without `EVERYSTEP_SESSION_URL` a worker refuses to
start, with one it takes its name there, and two workers never hold one
name. The pooler's own upsets — its server connections closed under it
(``RECONNECT``), its clients held (``PAUSE``/``RESUME``), the pooler
restarted — lose no run and execute no step twice. A worker prepares no
statement before it knows the pooler is there, even while it waits for
the migrations.
"""

import collections
import signal
import subprocess
import sys
import urllib.parse
import uuid

import psycopg
import pytest
from django.db import connection

from everystep import schedule
from everystep.models import Step, Workflow
from everystep.resilience import timeouts
from tests import servers, workflows
from tests.helpers import database_url, session_url, wait_until
from tests.workerproc import REPO, manage_py_environment

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.backends("pgbouncer")]

RUNS = 60
STEPS = 3


def schedule_journaled(tmp_path, count=RUNS):
    path = tmp_path / "journal"
    path.touch()
    return path, [schedule(workflows.journaled, str(path), n, STEPS).id for n in range(count)]


def wait_completed(run_ids, timeout=120):
    wait_until(
        lambda: Workflow.objects.filter(id__in=run_ids, status="completed").count() == len(run_ids),
        timeout=timeout,
        message=f"{len(run_ids)} runs completed",
    )


def assert_each_step_once(path, run_ids):
    """Every step of every run recorded once and executed once."""
    executed = collections.Counter(path.read_text().split())
    expected = {f"{n}:{i}" for n in range(len(run_ids)) for i in range(STEPS)}
    assert set(executed) == expected
    assert [key for key, times in executed.items() if times > 1] == []
    assert Step.objects.filter(workflow_id__in=run_ids).count() == len(run_ids) * STEPS


def clients_held():
    """Whether PgBouncer holds a client waiting for a server connection."""
    return any(row[3] > 0 for row in servers.pgbouncer_admin("SHOW POOLS"))


def stop(*workers):
    for worker in workers:
        worker.send(signal.SIGTERM)
    for worker in workers:
        assert worker.wait() == 0, worker.log()


def test_without_a_session_url_a_worker_behind_the_pooler_refuses_to_start(spawn_worker):
    worker = spawn_worker("pooled", env={"EVERYSTEP_SESSION_URL": ""})
    assert worker.wait(timeout=60) == 2, worker.log()
    errors = [line for line in worker.log().splitlines() if "connection pooler" in line]
    assert len(errors) == 1, worker.log()
    assert "EVERYSTEP_SESSION_URL" in errors[0]
    assert "Traceback" not in worker.log()


def test_the_zipapp_behind_the_pooler_says_so_and_exits_2(pyz, tmp_path):
    from tests.zipapp import run_pyz, workflow_environment

    env = workflow_environment()
    del env["EVERYSTEP_SESSION_URL"]
    result = run_pyz(pyz, "worker", env=env, cwd=tmp_path, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "connection pooler" in result.stderr and "EVERYSTEP_SESSION_URL" in result.stderr
    assert "Traceback" not in result.stderr


def test_runs_complete_through_the_pooler_each_step_once(spawn_worker, tmp_path):
    assert session_url()
    path, run_ids = schedule_journaled(tmp_path)
    workers = [spawn_worker(f"pooled-{i}", "--pool", "4") for i in range(2)]
    for worker in workers:
        worker.wait_ready()
        log = worker.log()
        assert "reached through a connection pooler" in log
        assert "woken by LISTEN/NOTIFY" in log
    wait_completed(run_ids)
    assert_each_step_once(path, run_ids)
    # The workers' claims and steps came through PgBouncer's pool.
    pools = servers.pgbouncer_admin("SHOW POOLS")
    assert any(row[0] == "everystep" or row[0].startswith("test_") for row in pools)
    stop(*workers)
    for worker in workers:
        assert "lock on its name was lost" not in worker.log()
        assert "prepared statement" not in worker.log()


def test_two_workers_never_hold_one_name_through_the_pooler(spawn_worker, tmp_path):
    path, run_ids = schedule_journaled(tmp_path)
    first = spawn_worker("one-name", "--pool", "4").wait_ready()
    # A second worker under the name, while the first holds it and its
    # claims and steps churn the pooler's server sessions.
    second = spawn_worker("one-name", "--drain", "2")
    assert second.wait(timeout=60) == 2, second.log()
    assert "ready" not in second.log()
    wait_completed(run_ids)
    assert_each_step_once(path, run_ids)
    stop(first)
    assert "lock on its name was lost" not in first.log()


@pytest.mark.parametrize("upset", ["RECONNECT", "PAUSE", "restart"])
def test_the_poolers_upsets_lose_no_run_and_repeat_no_step(spawn_worker, tmp_path, upset):
    path, run_ids = schedule_journaled(tmp_path, count=0)
    workers = [spawn_worker(f"upset-{i}", "--pool", "4") for i in range(2)]
    for worker in workers:
        worker.wait_ready()
    run_ids = [schedule(workflows.journaled, str(path), n, STEPS).id for n in range(RUNS)]
    wait_until(
        lambda: Step.objects.filter(workflow_id__in=run_ids).count() >= STEPS * RUNS // 4,
        timeout=60,
        message="a quarter of the steps recorded",
    )
    if upset == "RECONNECT":
        servers.pgbouncer_admin("RECONNECT")
    elif upset == "PAUSE":
        servers.pgbouncer_admin("PAUSE")
        wait_until(clients_held, timeout=30, message="the workers' queries held by the pause")
        servers.pgbouncer_admin("RESUME")
    else:
        servers.running_server("pgbouncer").restart()
    wait_completed(run_ids, timeout=180)
    assert_each_step_once(path, run_ids)
    stop(*workers)


LISTEN_SESSION_SQL = """
    SELECT pid, backend_start FROM pg_stat_activity
     WHERE datname = current_database() AND state = 'idle'
       AND query = 'LISTEN everystep_scheduled'
       AND state_change < now() - interval '3 seconds'
"""


def test_a_listen_session_cut_off_from_its_worker_is_ended_by_the_server(
    fault_proxy, spawn_worker, tmp_path
):
    """Behind the pooler a worker ends no session itself (the pooler's ids
    name none on the server). Its LISTEN session, cut off right after the
    LISTEN, which the server still holds (the proxy keeps its socket open,
    so no keepalive fails), is ended by the server once idle for its
    timeout; the worker listens again on a new session meanwhile."""
    direct = session_url()
    proxy = fault_proxy(direct)
    proxy.silence_after(b"LISTEN everystep_scheduled")
    worker = spawn_worker(
        "cut-listener", "--db-deadline", "3", env={"EVERYSTEP_SESSION_URL": proxy.url(direct)}
    ).wait_ready()
    with psycopg.connect(direct, autocommit=True) as server:

        def cut_off_sessions():
            return server.execute(LISTEN_SESSION_SQL).fetchall()

        wait_until(
            lambda: proxy.connections_silenced == 1 and cut_off_sessions(),
            timeout=30,
            message="the LISTEN session cut off, still on the server",
        )
        [cut_off] = cut_off_sessions()
        # The worker goes on, listening on a new session.
        path, run_ids = schedule_journaled(tmp_path, count=1)
        wait_completed(run_ids, timeout=30)
        wait_until(
            lambda: cut_off not in cut_off_sessions(),
            timeout=timeouts.IDLE_SESSION_TIMEOUT + 30,
            message=f"the server to end the cut-off LISTEN session {cut_off}",
        )
    stop(worker)


@pytest.fixture
def unmigrated_database():
    """A new, empty database on the test PostgreSQL: ``(its URL through
    PgBouncer, its direct URL)``."""
    name = f"everystep_early_{uuid.uuid4().hex[:8]}"
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE DATABASE {name}")
    pooled = database_url().rsplit("/", 1)[0] + f"/{name}"
    direct = urllib.parse.urlsplit(servers.server_url("postgres"))._replace(path=f"/{name}")
    yield pooled, direct.geturl()
    servers.pgbouncer_admin(f"KILL {name}")
    with connection.cursor() as cursor:
        cursor.execute(f"DROP DATABASE {name} WITH (FORCE)")


def open_server_connections(url, count):
    """Make PgBouncer open `count` server connections to `url`'s database:
    as many transactions at once, then let them go back to its pool."""
    clients = [psycopg.connect(url, prepare_threshold=None) for _ in range(count)]
    for client in clients:
        client.execute("SELECT 1")  # a transaction begun: a server held
    for client in clients:
        client.commit()  # a server left in a transaction would be closed
        client.close()


def most_calls_of_one_statement(database):
    """How many times the server ran the statement it ran most in `database`."""
    with connection.cursor() as cursor:
        cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        cursor.execute(
            "SELECT coalesce(max(calls), 0) FROM pg_stat_statements "
            "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = %s)",
            [database],
        )
        return cursor.fetchone()[0]


def test_a_worker_waiting_for_the_migrations_through_the_pooler_prepares_nothing(
    spawn_worker, unmigrated_database
):
    """Waiting for the migrations, a worker looks at them every second
    through the pooler, each look in another server session; a statement
    prepared in one (psycopg prepares one run five times) does not exist in
    the next. The worker prepares none before it knows the pooler is there,
    and starts once the migrations are applied."""
    pooled, direct = unmigrated_database
    database = urllib.parse.urlsplit(direct).path.lstrip("/")
    open_server_connections(pooled, 3)
    env = {"EVERYSTEP_DATABASE_URL": pooled, "EVERYSTEP_SESSION_URL": direct}
    worker = spawn_worker("early", "--wait-for-migrations", "120", env=env)
    worker.wait_for_log("waiting up to 120s")

    def looked_eight_times():
        assert worker.alive(), worker.log()
        return most_calls_of_one_statement(database) >= 8

    wait_until(looked_eight_times, timeout=60, message="the worker's 8th look at the migrations")
    migrate = subprocess.run(
        [sys.executable, "-m", "django", "migrate", "-v", "0"],
        env=manage_py_environment({"EVERYSTEP_DATABASE_URL": direct}),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert migrate.returncode == 0, migrate.stderr
    worker.wait_ready()
    assert "does not exist" not in worker.log()
    stop(worker)
