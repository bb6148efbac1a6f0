"""Cron (§13): ``@workflow(cron=..., timezone=...)``. One run per tick
however many workers schedule it, missed ticks collapse into the latest,
and the tick survives every worker restarting at once. The engine's clock
is moved by the tests instead of waited for."""

import datetime
import importlib
import io
import json
import signal
import sys

import pytest
from django.core.management import call_command

from everystep import workflow
from everystep.core import cron, registry
from everystep.db import runs
from everystep.errors import EverystepError
from everystep.models import Workflow
from tests.helpers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

UTC = datetime.UTC
FIVE = "tests.cron_workflows.every_five_minutes"
PARIS = "tests.cron_workflows.nine_in_paris"


@pytest.fixture
def cron_workflows():
    """The cron test workflows, registered for this test only."""
    module = importlib.import_module("tests.cron_workflows")
    importlib.reload(module)
    yield module
    for name in (FIVE, PARIS):
        registry.unregister(name)
    sys.modules.pop("tests.cron_workflows", None)


def at(moment):
    """A clock stopped at `moment`."""
    return lambda: moment


def schedule_ticks(ticker, now):
    """What a worker's turn does: insert the run of each tick come."""
    for schedule, tick in ticker.due(now):
        runs.insert_tick(schedule.workflow, cron.tick_key(tick), tick)
        ticker.scheduled(schedule, tick)


def runs_of(name):
    return list(Workflow.objects.filter(name=name).order_by("run_at"))


def test_many_workers_schedule_one_run_per_tick(cron_workflows):
    now = datetime.datetime(2026, 12, 4, 10, 7, 30, tzinfo=UTC)
    workers = [cron.Ticker(registry.schedules()) for _ in range(5)]
    for ticker in workers:
        schedule_ticks(ticker, now)
    [run] = runs_of(FIVE)
    assert run.run_at == datetime.datetime(2026, 12, 4, 10, 5, tzinfo=UTC)
    assert run.idempotency_key == "cron:2026-12-04T10:05:00+00:00"
    assert run.args == []

    for ticker in workers:  # the same tick again: nothing new
        schedule_ticks(ticker, now + datetime.timedelta(minutes=2))
    assert len(runs_of(FIVE)) == 1
    for ticker in workers:
        schedule_ticks(ticker, now + datetime.timedelta(minutes=3))
    assert [run.run_at.minute for run in runs_of(FIVE)] == [5, 10]


def test_ticks_missed_while_no_worker_ran_collapse_into_the_latest(cron_workflows):
    start = datetime.datetime(2026, 12, 4, 10, 0, tzinfo=UTC)
    schedule_ticks(cron.Ticker(registry.schedules()), start)
    # Every worker down for an hour and a half, then all restart at once.
    later = start + datetime.timedelta(hours=1, minutes=32)
    for _ in range(3):
        schedule_ticks(cron.Ticker(registry.schedules()), later)
    assert [run.run_at for run in runs_of(FIVE)] == [
        start,
        datetime.datetime(2026, 12, 4, 11, 30, tzinfo=UTC),
    ]


def test_a_cron_expression_is_read_in_its_time_zone(cron_workflows):
    [schedule] = [s for s in registry.schedules() if s.workflow == PARIS]
    winter = datetime.datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
    summer = datetime.datetime(2026, 7, 4, 12, 0, tzinfo=UTC)
    assert schedule.latest_tick(winter) == datetime.datetime(2026, 12, 4, 8, 0, tzinfo=UTC)
    assert schedule.latest_tick(summer) == datetime.datetime(2026, 7, 4, 7, 0, tzinfo=UTC)
    assert schedule.next_tick(winter) == datetime.datetime(2026, 12, 5, 8, 0, tzinfo=UTC)


def test_a_worker_runs_each_tick_once_as_the_clock_moves(cron_workflows, embedded_worker, calls):
    from everystep.core import clock

    moment = [datetime.datetime(2026, 12, 4, 10, 1, tzinfo=UTC)]
    clock.override = lambda: moment[0]
    try:
        embedded_worker(name="cron-1")
        embedded_worker(name="cron-2")
        wait_until(
            lambda: [run.status for run in runs_of(FIVE)] == ["completed"],
            message="the latest tick's run to complete",
        )
        moment[0] += datetime.timedelta(minutes=5)
        wait_until(
            lambda: [run.status for run in runs_of(FIVE)] == ["completed", "completed"],
            message="the next tick's run to complete",
        )
        # Counted while the clock still reads the second tick: once it is
        # given back, the workers still running schedule today's tick.
        assert calls["tick"] >= 2  # (the Paris one ran its latest tick too)
        assert len(runs_of(FIVE)) == 2
    finally:
        clock.override = None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"cron": "61 * * * *"}, "<locals>.bad: cron '61 * * * *' is not a cron expression"),
        ({"cron": "every day"}, "is not a cron expression"),
        ({"cron": "0 0 30 2 *"}, "names a date that never comes"),
        ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, "'Mars/Olympus' is not a time zone"),
        ({"retries": 3}, "retries are a step's option"),
    ],
)
def test_a_bad_cron_workflow_is_refused_when_its_module_is_imported(options, message):
    with pytest.raises(EverystepError, match=message.replace("*", r"\*")):

        @workflow(**options)
        def bad():
            pass

    assert not [name for name in registry.names() if name.endswith("<locals>.bad")]


def test_a_cron_workflow_takes_no_arguments():
    with pytest.raises(EverystepError, match="called with no arguments, but it needs day"):

        @workflow(cron="* * * * *")
        def needs_a_day(day):
            pass


def test_schedules_lists_each_cron_workflow_with_its_next_tick(cron_workflows):
    from everystep.core import clock

    clock.override = at(datetime.datetime(2026, 12, 4, 10, 7, tzinfo=UTC))
    try:
        schedule_ticks(cron.Ticker(registry.schedules()), clock.now())
        out = io.StringIO()
        call_command("everystep_schedules", "--json", stdout=out)
    finally:
        clock.override = None
    rows = {row["workflow"]: row for row in json.loads(out.getvalue())}
    assert rows[FIVE]["next_tick"] == "2026-12-04 10:10:00+00:00"
    assert rows[FIVE]["latest_status"] == "scheduled"
    assert rows[PARIS]["cron"] == "0 9 * * *" and rows[PARIS]["timezone"] == "Europe/Paris"


def test_the_schedules_command_of_the_zipapp(pyz, tmp_path):
    from tests.zipapp import run_pyz, workflow_environment

    env = workflow_environment(EVERYSTEP_WORKFLOWS="tests.cron_workflows")
    result = run_pyz(pyz, "schedules", env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert FIVE in result.stdout and "'*/5 * * * *' UTC  next " in result.stdout

    bad = tmp_path / "bad_cron.py"
    bad.write_text(
        "from everystep import workflow\n\n@workflow(cron='* * *')\ndef broken():\n    pass\n"
    )
    env = workflow_environment(EVERYSTEP_WORKFLOWS="bad_cron", EVERYSTEP_PATH=str(tmp_path))
    refused = run_pyz(pyz, "schedules", env=env, cwd=tmp_path)
    assert refused.returncode == 2
    [line] = refused.stderr.strip().splitlines()
    assert "workflow bad_cron.broken: cron '* * *' is not a cron expression" in line


def test_the_tick_survives_every_worker_restarting_at_once(spawn_worker, tmp_path):
    """Two worker processes with the cron workflows, killed together, then
    two others: the latest tick ran once."""
    env = {"EVERYSTEP_TEST_WORKFLOWS": "tests.workflows,tests.cron_workflows"}
    first = [spawn_worker(f"cron-a{i}", env=env).wait_ready() for i in range(2)]
    # At least one: a five-minute boundary may pass while the workers start,
    # and the next tick have its run too (one run per tick is asserted below).
    wait_until(lambda: runs_of(FIVE), message="the tick's run to be scheduled")
    for worker in first:
        worker.send(signal.SIGKILL)
    for worker in first:
        worker.wait()
    second = [spawn_worker(f"cron-b{i}", env=env).wait_ready() for i in range(2)]
    wait_until(
        lambda: (
            [run.status for run in runs_of(FIVE)] == ["completed"]
            or len(runs_of(FIVE)) > 1
            and [run.status for run in runs_of(FIVE)][-1] == "completed"
        ),
        message="the tick's run to complete",
    )
    # One run per tick: a restart schedules nothing new for a tick that has one.
    keys = [run.idempotency_key for run in runs_of(FIVE)]
    assert len(keys) == len(set(keys))
    for worker in second:
        worker.send(signal.SIGTERM)
    for worker in second:
        assert worker.wait() == 0
