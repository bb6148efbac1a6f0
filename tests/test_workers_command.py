"""The workers table (§11) as operators read it: ``manage.py
everystep_workers`` and the zipapp's ``everystep workers``, as a table or
as JSON, with a worker whose heartbeat is too old shown as lost."""

import datetime
import io
import json
import re
import signal

import pytest
from django.core.management import call_command
from django.utils import timezone

from everystep.models import Worker
from tests.helpers import wait_until
from tests.zipapp import run_pyz, workflow_environment

pytestmark = pytest.mark.django_db(transaction=True)


def everystep_workers(*args):
    """The output of ``manage.py everystep_workers ARGS``."""
    out = io.StringIO()
    call_command("everystep_workers", *args, stdout=out)
    return out.getvalue()


def listed(name, state=None):
    """The worker `name` as ``everystep_workers --json`` lists it (in
    `state`, when given), or None."""
    rows = json.loads(everystep_workers("--json"))
    return next(
        (row for row in rows if row["name"] == name and state in (None, row["state"])), None
    )


def worker_row(name, *, state="ready", heartbeat_age=0):
    """A worker's row as its process would have left it, its heartbeat
    `heartbeat_age` seconds old."""
    heartbeat = timezone.now() - datetime.timedelta(seconds=heartbeat_age)
    return Worker.objects.create(
        name=name,
        hostname="host-1",
        pid=4321,
        version="1.0",
        pool_size=4,
        state=state,
        started_at=heartbeat - datetime.timedelta(hours=1),
        heartbeat_at=heartbeat,
        stopped_at=heartbeat if state == "stopped" else None,
    )


def table_rows(text):
    """The rows of the table `text` as {name: [cells]}, after checking its header."""
    header, *lines = text.strip().splitlines()
    assert header.split()[:3] == ["name", "state", "hostname"]
    return {line.split()[0]: line.split() for line in lines}


def test_a_running_worker_is_listed_ready_then_stopped_after_sigterm(spawn_worker):
    worker = spawn_worker("listed", "--pool", "3").wait_ready()
    row = wait_until(lambda: listed("listed", state="ready"), message="the worker listed ready")
    assert (row["pid"], row["pool_size"], row["in_flight"]) == (worker.pid, 3, 0)
    assert row["stopped_at"] is None and row["heartbeat_age_seconds"] < Worker.LOST_AFTER
    datetime.datetime.fromisoformat(row["started_at"])

    worker.send(signal.SIGTERM)
    assert worker.wait() == 0
    row = listed("listed")
    assert row["state"] == "stopped"
    assert datetime.datetime.fromisoformat(row["stopped_at"]) >= datetime.datetime.fromisoformat(
        row["started_at"]
    )


def test_a_worker_whose_heartbeat_is_older_than_60s_shows_as_lost_live_ones_first():
    worker_row("zz-live", heartbeat_age=2)
    worker_row("gone", heartbeat_age=Worker.LOST_AFTER + 1)
    worker_row("ended", state="stopped", heartbeat_age=3 * 3600)

    rows = json.loads(everystep_workers("--json"))
    assert [(row["name"], row["state"]) for row in rows] == [
        ("zz-live", "ready"),
        ("ended", "stopped"),
        ("gone", "lost"),
    ]
    assert rows[2]["heartbeat_age_seconds"] > Worker.LOST_AFTER

    table = table_rows(everystep_workers())
    assert list(table) == ["zz-live", "ended", "gone"]
    assert table["gone"][1] == "lost" and re.search(r" 6\ds ago ", " ".join(table["gone"]))
    assert table["zz-live"][1] == "ready" and table["zz-live"][-1] == "-"
    assert "3h ago" in " ".join(table["ended"])


def test_the_zipapp_prints_the_workers_table_from_outside_the_repository(pyz, tmp_path):
    def everystep(*args):
        result = run_pyz(pyz, *args, env=workflow_environment(), cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        return result.stdout

    assert everystep("workers").strip() == "no workers have run on this database"
    worker_row("gone", heartbeat_age=Worker.LOST_AFTER + 5)
    worker_row("alive")

    table = table_rows(everystep("workers"))
    assert list(table) == ["alive", "gone"]
    assert table["alive"][:5] == ["alive", "ready", "host-1", "4321", "1.0"]
    assert table["gone"][1] == "lost"


def test_a_silent_workers_row_names_the_worker_that_recovered_its_runs():
    from everystep.db import workers

    worker_row("w-gone", heartbeat_age=300)
    workers.recovered("w-gone", "w-rescuer", 2)
    row = listed("w-gone", "lost")
    assert (row["recovered_by"], row["recovered_runs"]) == ("w-rescuer", 2)
    assert row["recovered_at"] is not None
    line = next(line for line in everystep_workers().splitlines() if line.startswith("w-gone "))
    assert line.rstrip().endswith("2 by w-rescuer"), line
