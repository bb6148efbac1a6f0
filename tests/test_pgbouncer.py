"""Workers behind a connection pooler: PgBouncer in transaction mode, in
front of the test PostgreSQL, as platforms put one in front of theirs.

A worker's claims and step writes go through the pooler, each transaction
on whichever server session is free. Its name lock and LISTEN need a
session of their own: without `EVERYSTEP_SESSION_URL` a worker refuses to
start, with one it takes its name there, and two workers never hold one
name. The pooler's own upsets — its server connections closed under it
(``RECONNECT``), its clients held (``PAUSE``/``RESUME``), the pooler
restarted — lose no run and execute no step twice.
"""

import collections
import signal

import pytest

from everystep import schedule
from everystep.models import Step, Workflow
from tests import servers, workflows
from tests.helpers import session_url, wait_until

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
