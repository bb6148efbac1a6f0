"""A database that goes silent, resets, or loses a reply after its commit
(§10), through a fault-injecting proxy between the worker and the server."""

import re
import signal
import time

import pytest
from django.db import connection

from everystep import schedule
from everystep.models import Step
from tests import workflows
from tests.helpers import database_url, opened, park, started, statuses, wait_until
from tests.workerproc import timed_wait

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.backends("postgres", "mariadb")]


def proxied_worker(spawn_worker, proxy, name, *args):
    """A worker whose every connection goes through `proxy`."""
    env = {"EVERYSTEP_DATABASE_URL": proxy.url(database_url())}
    return spawn_worker(name, "--poll", "0.05", *args, env=env).wait_ready()


def server_sessions():
    """The ids of the sessions on the test server, but the test's own."""
    if connection.vendor == "postgresql":
        sql = (
            "SELECT pid FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND datname IS NOT NULL"
        )
    else:
        sql = "SELECT id FROM information_schema.processlist WHERE id <> CONNECTION_ID()"
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return {row[0] for row in cursor.fetchall()}


def test_a_silent_database_is_noticed_within_30s_and_runs_complete_within_15s_of_its_return(
    fault_proxy, spawn_worker
):
    proxy = fault_proxy(database_url())
    others = server_sessions()
    worker = proxied_worker(spawn_worker, proxy, "patient", "--pool", "4")
    runs = [schedule(workflows.napping, 0.2, 10).id for _ in range(8)]
    wait_until(lambda: statuses(runs).get("completed", 0) >= 1, message="work under way")
    cut_off = server_sessions() - others

    proxy.blackhole()
    silent_at = time.monotonic()
    worker.wait_for_log("database unreachable", timeout=45)
    noticed = time.monotonic() - silent_at
    assert noticed < 30, f"noticed after {noticed:.1f}s"

    proxy.pass_through()
    back_at = time.monotonic()
    wait_until(
        lambda: statuses(runs) == {"completed": len(runs)},
        timeout=60,
        message="every run completed after the database came back",
    )
    healed = time.monotonic() - back_at
    assert healed < 15, f"runs completed {healed:.1f}s after the database came back"
    assert "database reachable again" in worker.log()
    print(f"silent database: noticed in {noticed:.1f}s, runs done {healed:.1f}s after healing")
    # The server never learned that those connections were cut off: the
    # worker ends their sessions itself.
    wait_until(
        lambda: not server_sessions() & cut_off,
        timeout=15,
        message=f"the sessions of the cut-off connections to end ({cut_off} before)",
    )
    worker.send(signal.SIGTERM)
    assert worker.wait() == 0


def test_a_connection_cut_off_inside_a_claim_leaves_no_run_locked_behind(fault_proxy, spawn_worker):
    """The take-back's locking read reaches the server, then its connection
    goes silent: the server keeps that session, inside its transaction, with
    the runs' rows locked, so every claim skips them. Once the database
    answers, the worker ends the session it gave up and claims the runs."""
    runs = [park(workflows.quick, n, worker="unlocked").id for n in range(3)]
    proxy = fault_proxy(database_url())
    proxy.silence_after(b"FOR UPDATE SKIP LOCKED")  # the claim's locking read
    env = {"EVERYSTEP_DATABASE_URL": proxy.url(database_url())}
    began = time.monotonic()
    worker = spawn_worker("unlocked", "--poll", "0.05", "--db-deadline", "3", env=env)
    wait_until(
        lambda: statuses(runs) == {"completed": len(runs)},
        timeout=60,
        message="the runs whose rows the cut-off session had locked to complete",
    )
    took = time.monotonic() - began
    assert proxy.connections_silenced == 1
    assert "claiming runs" in worker.log(), worker.log()
    assert "database session(s) left open by connections cut off" in worker.log(), worker.log()
    assert took < 30, f"the runs completed {took:.1f}s after the worker started"
    print(f"a claim cut off with its rows locked: the runs completed after {took:.1f}s")
    worker.send(signal.SIGTERM)
    assert worker.wait() == 0


def test_sigterm_during_a_silent_database_exits_within_drain_plus_10s_naming_parked_runs(
    fault_proxy, spawn_worker, tmp_path
):
    proxy = fault_proxy(database_url())
    worker = proxied_worker(spawn_worker, proxy, "cut-off", "--drain", "5")
    run = schedule(workflows.gated, str(tmp_path))
    started(tmp_path, "first")

    proxy.blackhole()
    worker.send(signal.SIGTERM)
    code, seconds = timed_wait(worker, 60)
    assert seconds < 5 + 10, f"took {seconds:.1f}s to exit with --drain 5"
    assert code == 0, worker.log()
    last = worker.log().strip().splitlines()[-1]
    parked = [line for line in worker.log().splitlines() if "stay claimed" in line]
    assert parked and str(run.id) in parked[-1], worker.log()
    assert "stopped" in last
    print(f"SIGTERM during a silent database: exited in {seconds:.1f}s with --drain 5")

    # The database answers again; the server ends the dead worker's session
    # and its name comes back, so a restart under it resumes the parked run.
    proxy.pass_through()
    opened(tmp_path, "first")
    opened(tmp_path, "second")
    back_at = time.monotonic()
    restarted = spawn_worker("cut-off", "--drain", "90", "--poll", "0.05")
    wait_until(lambda: statuses([run.id]) == {"completed": 1}, timeout=90)
    took = time.monotonic() - back_at
    assert took < 60, f"the name came back {took:.0f}s after the database did"
    print(f"a dead worker's name came back and its run completed {took:.1f}s after healing")
    restarted.send(signal.SIGTERM)
    assert restarted.wait() == 0


def test_a_reply_lost_after_an_unsafe_steps_outcome_landed_does_not_block_the_run(
    fault_proxy, spawn_worker
):
    """The runner finds out that its write landed instead of taking the lost
    reply for a lost claim (or, worse, for an uncertain effect)."""
    proxy = fault_proxy(database_url())
    proxy.lose_reply_to(b"charged")  # the step's outcome, written once
    worker = proxied_worker(spawn_worker, proxy, "lossy")
    run = schedule(workflows.pay, 4242)
    wait_until(lambda: statuses([run.id]) == {"completed": 1}, timeout=30)
    assert proxy.replies_lost == 1
    charge = Step.objects.get(workflow_id=run.id, step_id="1")
    assert (charge.status, charge.result) == ("done", {"charged": 4242})
    worker.send(signal.SIGTERM)
    assert worker.wait() == 0


@pytest.mark.backends("postgres")
def test_a_claim_whose_reply_was_lost_after_its_commit_strands_no_run(fault_proxy, spawn_worker):
    """On PostgreSQL a claim is one statement: its reply lost after the
    commit leaves the run ``running`` under the worker's name, unknown to
    it. The worker takes it back on its next turn."""
    run = schedule(workflows.quick, 7)
    proxy = fault_proxy(database_url())
    proxy.lose_reply_to(b"status = 'scheduled'")
    worker = proxied_worker(spawn_worker, proxy, "forgetful", "--no-catchup")
    wait_until(lambda: statuses([run.id]) == {"completed": 1}, timeout=60)
    assert proxy.replies_lost == 1
    assert re.search(r"resumed parked 1 run\(s\): " + str(run.id), worker.log()), worker.log()
    assert connection.vendor == "postgresql"
    worker.send(signal.SIGTERM)
    assert worker.wait() == 0


def test_sigterm_while_the_zipapp_worker_waits_for_its_database_exits_0(
    fault_proxy, pyz, spawn_process, tmp_path
):
    from tests.zipapp import workflow_environment

    proxy = fault_proxy(database_url())
    proxy.refuse()
    env = workflow_environment(proxy.url(database_url()))
    worker = spawn_process(
        "starting", [str(pyz), "worker", "--name", "early"], env=env, cwd=tmp_path
    )
    worker.wait_for_log("retrying")
    worker.send(signal.SIGTERM)
    code, seconds = timed_wait(worker, 30)
    assert code == 0, worker.log()
    assert seconds < 10
    assert "ready" not in worker.log()
