"""Database outages fail nothing (§7): a restart under load completes every run."""

import os
import signal

import pytest

from everystep import schedule
from everystep.models import Workflow
from tests import servers, workflows
from tests.helpers import query_until_reachable, statuses, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.backends("postgres", "mariadb")]


def the_server():
    server = servers.running_server(os.environ["EVERYSTEP_TEST_DB"])
    assert server is not None, "this test restarts the server, so it must be the suite's own"
    return server


def test_a_database_restart_with_runs_in_flight_fails_nothing_and_the_worker_survives(
    spawn_worker,
):
    server = the_server()
    runs = [schedule(workflows.napping, 0.05, 6).id for _ in range(40)]
    worker = spawn_worker("steadfast", "--pool", "8", "--poll", "0.05").wait_ready()
    wait_until(lambda: statuses(runs).get("completed", 0) >= 3, message="some runs completed")
    assert statuses(runs).get("scheduled", 0) > 0, "the restart must hit runs still to come"

    server.restart()
    wait_until(
        lambda: query_until_reachable(lambda: statuses(runs)) == {"completed": len(runs)},
        timeout=120,
        message="every run completed after the restart",
    )
    assert worker.alive()
    assert "database unreachable" in worker.log()
    worker.send(signal.SIGTERM)
    assert worker.wait() == 0
    assert not Workflow.objects.filter(status="failed").exists()


def test_a_worker_that_starts_while_the_database_is_down_waits_for_it(spawn_worker):
    server = the_server()
    run = schedule(workflows.quick, 1)
    server.stop()
    try:
        worker = spawn_worker("early")
        worker.wait_for_log("retrying")
    finally:
        server.start()
    worker.wait_ready()
    wait_until(
        lambda: query_until_reachable(lambda: statuses([run.id])) == {"completed": 1},
        message="the run completed",
    )
    worker.send(signal.SIGTERM)
    assert worker.wait() == 0


def test_the_name_lock_is_taken_again_after_a_restart(spawn_worker):
    server = the_server()
    worker = spawn_worker("locked", "--poll", "0.05").wait_ready()
    server.restart()
    run = query_until_reachable(lambda: schedule(workflows.quick, 1))
    wait_until(lambda: query_until_reachable(lambda: statuses([run.id])) == {"completed": 1})
    wait_until(lambda: "taking it again" in worker.log(), message="the lock retaken")
    twin = spawn_worker("locked", "--drain", "1")
    assert twin.wait() == 2  # the name is still held by the live worker
    worker.send(signal.SIGTERM)
    assert worker.wait() == 0
