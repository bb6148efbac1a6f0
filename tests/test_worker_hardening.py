"""Where the guarantees must hold (§10): a silent or frozen peer, a lost
name, wrong settings, a bug in the loop, a run stranded under a live worker."""

import copy
import logging
import signal
import socket
import sys
import threading
import time

import pytest
from django.db import InterfaceError, OperationalError, connection, connections

from everystep import schedule
from everystep.db import claims
from everystep.models import Workflow
from everystep.resilience import classify, deadline, timeouts
from tests import workflows
from tests.helpers import database_url, park, statuses, wait_until
from tests.workerproc import manage_py_environment, stop_embedded, timed_wait

pytestmark = pytest.mark.django_db(transaction=True)
servers_only = pytest.mark.backends("postgres", "mariadb")


@servers_only
def test_a_frozen_workers_name_comes_back_and_the_frozen_worker_then_exits_2(spawn_worker):
    """A worker that stops answering (SIGSTOP: its sockets stay open, as in a
    partition) loses its name to the server's idle timeout, so a new worker
    under that name starts; the old one, thawed, finds its name taken."""
    frozen = spawn_worker("frozen", "--poll", "0.05").wait_ready()
    frozen.send(signal.SIGSTOP)
    try:
        began = time.monotonic()
        successor = spawn_worker("frozen", "--drain", "120", "--poll", "0.05")
        successor.wait_for_log("held by a live worker")
        successor.wait_ready(timeout=90)
        took = time.monotonic() - began
    finally:
        frozen.send(signal.SIGCONT)
    assert took < 60, f"the name came back after {took:.0f}s"

    code, _ = timed_wait(frozen, 60)
    assert code == 2, frozen.log()
    last = frozen.log().strip().splitlines()[-1]
    assert "'frozen'" in last and "taken by another process" in last

    run = schedule(workflows.quick, 3)
    wait_until(lambda: statuses([run.id]) == {"completed": 1}, message="the successor works")
    successor.send(signal.SIGTERM)
    assert successor.wait() == 0


def url_with(**changes):
    """The test database's URL with its password, database or host changed."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(database_url())
    user = parts.username
    password = changes.get("password", parts.password)
    host = changes.get("host", parts.hostname)
    netloc = f"{user}:{password}@{host}:{parts.port}" if password else f"{user}@{host}:{parts.port}"
    path = "/" + changes.get("database", parts.path.lstrip("/"))
    return urlunsplit(parts._replace(netloc=netloc, path=path))


@servers_only
@pytest.mark.parametrize(
    "change",
    [
        {"password": "not-the-password"},
        {"database": "no_such_database"},
        {"host": "no-such-host.invalid"},
    ],
    ids=["wrong password", "unknown database", "unknown host"],
)
def test_wrong_settings_exit_2_with_one_line_within_10_seconds(spawn_worker, change):
    worker = spawn_worker("misconfigured", env={"EVERYSTEP_DATABASE_URL": url_with(**change)})
    code, seconds = timed_wait(worker, 30)
    assert code == 2, worker.log()
    assert seconds < 10, f"took {seconds:.1f}s"
    lines = worker.log().strip().splitlines()
    assert "Traceback" not in worker.log()
    assert "refuses these settings" in lines[-1]
    assert "not-the-password" not in worker.log()


def test_a_name_too_long_for_the_column_exits_2_before_anything_runs(spawn_process):
    command = [sys.executable, "-m", "django", "everystep_worker", "--name", "n" * 300]
    worker = spawn_process("long-name", command, env=manage_py_environment())
    code, seconds = timed_wait(worker, 30)
    assert code == 2, worker.log()
    assert "255" in worker.log().strip().splitlines()[-1]
    assert "ready" not in worker.log()


def test_a_run_stranded_under_the_live_workers_own_name_is_taken_back(spawn_worker):
    """A claim whose reply was lost after its commit leaves a run ``running``
    under this worker's name; the worker takes it back within a minute."""
    worker = spawn_worker("keeper", "--poll", "0.05").wait_ready()
    stranded = park(workflows.quick, 5, worker="keeper")
    wait_until(
        lambda: statuses([stranded.id]) == {"completed": 1},
        timeout=60,
        message="the stranded run completed",
    )
    assert Workflow.objects.get(id=stranded.id).result == 10
    assert "resumed parked 1 run(s)" in worker.log()
    worker.send(signal.SIGTERM)
    assert worker.wait() == 0


def test_a_bug_in_the_loop_is_logged_at_error_with_its_traceback_rate_limited(
    embedded_worker, monkeypatch, caplog
):
    turns = []
    real_claim = claims.claim

    def broken_claim(*args, **kwargs):
        turns.append(time.monotonic())
        raise RuntimeError("a bug in the claim")

    monkeypatch.setattr(claims, "claim", broken_claim)
    caplog.set_level(logging.INFO, logger="everystep")
    worker = embedded_worker(name="buggy", poll=0.05)
    wait_until(lambda: len(turns) >= 4, message="the loop keeps turning")
    errors = [r for r in caplog.records if getattr(r, "action", None) == "loop_error"]
    assert len(errors) == 1, "a traceback at most every few seconds"
    assert errors[0].levelno == logging.ERROR and errors[0].exc_info is not None
    assert "a bug in the claim" in errors[0].getMessage()
    assert not any("unreachable" in r.getMessage() for r in caplog.records)

    monkeypatch.setattr(claims, "claim", real_claim)
    run = schedule(workflows.quick, 1)
    wait_until(lambda: statuses([run.id]) == {"completed": 1}, message="the loop recovered")
    stop_embedded(worker)


@servers_only
def test_an_engine_operation_past_its_deadline_has_its_connection_given_up(monkeypatch):
    monkeypatch.setattr(deadline, "seconds", 1.0)
    postgres = connection.vendor == "postgresql"
    wrapper = connections.create_connection("default")
    with wrapper.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()" if postgres else "SELECT CONNECTION_ID()")
        (session,) = cursor.fetchone()
    began = time.monotonic()
    try:
        with pytest.raises((OperationalError, InterfaceError)) as failure:
            with deadline.guard(wrapper, "testing the deadline"):
                with wrapper.cursor() as cursor:
                    cursor.execute("SELECT pg_sleep(30)" if postgres else "SELECT SLEEP(30)")
    finally:
        wrapper.close()
        with connection.cursor() as cursor:  # the server-side sleep goes on otherwise
            cursor.execute(
                f"SELECT pg_terminate_backend({session})" if postgres else f"KILL {session}"
            )
    assert time.monotonic() - began < 5
    assert classify.is_transient(failure.value)


@servers_only
def test_connections_get_a_connect_timeout_keepalives_and_a_user_timeout_by_default():
    settings = timeouts.harden(copy.deepcopy(connection.settings_dict))
    wrapper = connections["default"].__class__(settings, "hardened")
    wrapper.ensure_connection()
    try:
        raw = wrapper.connection
        if connection.vendor == "postgresql":
            parameters = raw.info.get_parameters()
            assert parameters["connect_timeout"] == str(timeouts.CONNECT_TIMEOUT)
            assert parameters["keepalives_idle"] == str(timeouts.KEEPALIVE_IDLE)
            assert parameters["tcp_user_timeout"] == str(timeouts.USER_TIMEOUT * 1000)
        else:
            sock = raw._sock
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 10
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 20000
            assert sock.gettimeout() is None, "a long query of the user's own is not cut off"
    finally:
        wrapper.close()

    overridden = copy.deepcopy(connection.settings_dict)
    overridden.setdefault("OPTIONS", {})["connect_timeout"] = 7
    assert timeouts.harden(overridden)["OPTIONS"]["connect_timeout"] == 7


def test_a_worker_whose_name_guard_thread_dies_drains_and_stops_saying_which(monkeypatch, caplog):
    """A background thread that dies of a bug takes the worker down with it:
    the worker drains (its run finishes and is recorded), releases its name
    and `run()` raises `LoopDied` naming the thread, instead of going on
    without its hold on the name."""
    from everystep.worker import LoopDied, Worker, nameguard

    monkeypatch.setattr(nameguard, "CHECK_INTERVAL", 0.1)
    run = schedule(workflows.quick, 1)
    worker = Worker(name="guarded", poll=0.05)
    outcome = {}

    def run_worker():
        try:
            worker.run()
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            outcome["error"] = exc

    thread = threading.Thread(target=run_worker, daemon=True)
    thread.start()
    wait_until(lambda: statuses([run.id]) == {"completed": 1}, message="the run completed")

    def broken(self, held):
        raise RuntimeError("a bug in the name guard")

    monkeypatch.setattr(nameguard.NameGuard, "_set_held", broken)
    thread.join(30)
    assert not thread.is_alive(), "the worker did not stop"
    assert isinstance(outcome.get("error"), LoopDied), outcome
    assert str(outcome["error"]) == (
        "worker guarded: its name thread died: a bug in the name guard"
    )
    assert (
        "worker guarded: its name thread died: a bug in the name guard; draining and stopping"
        in caplog.text
    )
    # The name is free again: a new worker under it starts at once.
    monkeypatch.undo()
    successor = Worker(name="guarded", poll=0.05)
    successor_thread = threading.Thread(target=successor.run, daemon=True)
    successor_thread.start()
    try:
        wait_until(lambda: successor.health()[1], timeout=10, message="the successor ready")
    finally:
        successor.stop()
        successor_thread.join(30)
