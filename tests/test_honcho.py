"""The Procfile run on a developer's machine by honcho, as the README says:
the worker started before the migrations waits for ``honcho run everystep
migrate``, then runs a scheduled run; stopped with Ctrl-C, every process
drains and honcho reports each as exiting cleanly (``exec`` in the
Procfile: the signal reaches the process, not a shell)."""

import os
import pathlib
import shutil
import signal
import subprocess
import sys

import pytest

from tests.freshproject import empty_database_url
from tests.processes import kill_group
from tests.servers import free_base_port
from tests.settings import BACKEND
from tests.workerproc import REPO
from tests.zipapp import clean_environment

BIN = pathlib.Path(sys.executable).parent


@pytest.fixture
def honcho(tmp_path, spawn_process):
    """``honcho(*args)``: honcho in a directory holding the Procfile, on an
    empty database; every process it started is killed at the end."""
    shutil.copy(REPO / "Procfile", tmp_path / "Procfile")
    env = clean_environment(
        DATABASE_URL=empty_database_url(tmp_path),
        EVERYSTEP_WORKFLOWS="tests.workflows",
        EVERYSTEP_PATH=str(REPO),
        EVERYSTEP_UI_PASSWORD="local-secret",
        EVERYSTEP_UI_BIND="127.0.0.1",
        PATH=f"{BIN}:{os.environ['PATH']}",
    )
    started = []

    def start(*args):
        process = spawn_process(
            "honcho", [str(BIN / "honcho"), *args], env=env, cwd=tmp_path, start_new_session=True
        )
        started.append(process)
        return process

    def run(*args):
        return subprocess.run(
            [str(BIN / "honcho"), "run", *args],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=180,
        )

    start.run = run
    start.env = env
    yield start
    for process in started:
        kill_group(process.pid)


def test_the_worker_waits_for_the_release_runs_a_run_and_stops_cleanly_on_ctrl_c(honcho):
    local = honcho("start", "worker")
    if BACKEND != "sqlite":  # SQLite, the embedded default, is migrated on the spot
        local.wait_for_log("waiting up to 120s for `everystep migrate`")
        migrated = honcho.run("everystep", "migrate")
        assert migrated.returncode == 0, migrated.stderr
    local.wait_ready()
    scheduled = honcho.run("everystep", "schedule", "quick", "4")
    assert scheduled.returncode == 0, scheduled.stderr
    local.wait_for_log(f"run {scheduled.stdout.strip()} tests.workflows.quick completed")

    local.send(signal.SIGINT)  # Ctrl-C
    assert local.wait(60) == 130, local.log()  # honcho's own status for an interrupt
    assert "worker.1 stopped (rc=0)" in local.log(), local.log()
    assert "rc=-15" not in local.log()


def test_the_worker_and_the_web_process_run_side_by_side_after_the_release(honcho):
    migrated = honcho.run("everystep", "migrate")
    assert migrated.returncode == 0, migrated.stderr
    base = free_base_port(100)  # honcho gives each process its own PORT: base, base + 100
    local = honcho("start", "--port", str(base), "worker", "web")
    local.wait_ready()
    local.wait_for_log(f"operator UI serving on http://127.0.0.1:{base + 100}/")
    local.send(signal.SIGTERM)
    assert local.wait(60) == 143, local.log()  # honcho's own status for SIGTERM
    log = local.log()
    assert "worker.1 stopped (rc=0)" in log and "web.1 stopped (rc=0)" in log, log


def test_plain_honcho_start_on_a_fresh_database_ends_cleanly_with_the_release(honcho):
    """Plain `honcho start` starts every process of the Procfile at once, the
    release with the others, and stops them all when the release ends. None
    may fail meanwhile: on SQLite the release's migrate, the worker and the
    UI take turns migrating the new file; on a server the worker and the UI
    wait for the release instead of refusing to start."""
    local = honcho("start", "--port", str(free_base_port(100, 200)))
    assert local.wait(180) == 0, local.log()
    log = local.log()
    for process in ("release", "worker", "web"):
        assert f"{process}.1 stopped (rc=0)" in log, log
    assert "duplicate column" not in log and "Traceback" not in log, log
    checked = honcho.run("everystep", "check")
    assert "migrations: up to date" in checked.stdout, checked.stdout + checked.stderr
