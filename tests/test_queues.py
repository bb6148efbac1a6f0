"""Flow control (SPEC §14): queues, their limits across worker processes,
priority with aging, workers that serve some queues, and bad input.

Each limit is proven with real worker subprocesses claiming at the same
time: the recorded intervals of the runs' steps never overlap more than
the limit allows, and they do reach it.
"""

import datetime
import json
import subprocess
import sys
import time
import uuid

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from everystep import Queue, schedule, workflow
from everystep.core import queues
from everystep.db import claims
from everystep.db import queues as queue_rows
from everystep.errors import EverystepError
from everystep.models import Queue as QueueRow
from everystep.models import Step, Workflow
from tests import queue_workflows
from tests.helpers import statuses, wait_until
from tests.prometheus import PrometheusServer, prometheus_server  # noqa: F401
from tests.test_metrics import metrics_worker
from tests.test_runtime_commands import everystep, pyz_worker  # noqa: F401
from tests.workerproc import REPO, manage_py_environment
from tests.zipapp import one_line_error

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE_WORKFLOWS = {"EVERYSTEP_TEST_WORKFLOWS": "tests.workflows,tests.queue_workflows"}
HOLD = "tests.queue_workflows.hold"


def start_workers(spawn_worker, count, *args, prefix="q"):
    """`count` workers of pool 4 on the queue workflows, ready."""
    started = [
        spawn_worker(f"{prefix}{i}", "--pool", "4", "--poll", "0.05", *args, env=QUEUE_WORKFLOWS)
        for i in range(count)
    ]
    for worker in started:
        worker.wait_ready()
    return started


def finished(run_ids, timeout=60):
    wait_until(
        lambda: statuses(run_ids) == {"completed": len(run_ids)},
        timeout=timeout,
        message=f"{len(run_ids)} runs completed",
    )


def intervals(run_ids):
    """The recorded (start, end) of the runs' held steps."""
    return list(
        Step.objects.filter(workflow_id__in=run_ids, name=HOLD).values_list(
            "started_at", "finished_at"
        )
    )


def most_at_once(spans):
    """The largest number of `spans` that overlap at one instant."""
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    now = most = 0
    for _, change in edges:  # an end sorts before a start at the same instant
        now += change
        most = max(most, now)
    return most


def test_a_queues_concurrency_holds_across_workers_and_is_reached(spawn_worker):
    run_ids = [schedule(queue_workflows.tight, 0.6).id for _ in range(12)]
    start_workers(spawn_worker, 3)  # 12 slots for a queue of 3
    finished(run_ids)
    assert most_at_once(intervals(run_ids)) == 3


def test_a_key_runs_one_at_a_time_while_other_keys_run_beside_it(spawn_worker):
    by_key = {
        key: [schedule(queue_workflows.per_customer, 0.4, concurrency_key=key).id for _ in range(3)]
        for key in ("customer-1", "customer-2", "customer-3")
    }
    start_workers(spawn_worker, 2)
    every = [run_id for run_ids in by_key.values() for run_id in run_ids]
    finished(every)
    for run_ids in by_key.values():
        assert most_at_once(intervals(run_ids)) == 1
    assert most_at_once(intervals(every)) == 3


def test_a_rate_limit_bounds_first_starts_in_every_window_and_is_reached(spawn_worker):
    limit, window = queue_workflows.METERED.rate
    run_ids = [schedule(queue_workflows.metered).id for _ in range(10)]
    start_workers(spawn_worker, 2)
    finished(run_ids)
    starts = sorted(Workflow.objects.filter(id__in=run_ids).values_list("started_at", flat=True))
    span = datetime.timedelta(seconds=window)
    in_window = [sum(1 for other in starts if start <= other < start + span) for start in starts]
    assert max(in_window) == limit
    # Held runs start as soon as the window lets them (one poll late at most).
    assert starts[-1] - starts[0] < datetime.timedelta(seconds=2 * window + 1.5)


def test_a_worker_serves_only_its_queues_and_check_names_the_one_nobody_serves(
    spawn_worker, capsys
):
    report = schedule(queue_workflows.report, 0.0)
    elsewhere = schedule(queue_workflows.anywhere, 0.0)
    start_workers(spawn_worker, 1, "--queue", "default")
    finished([elsewhere.id])
    assert Workflow.objects.get(id=report.id).status == "scheduled"
    [reports] = [queue for queue in queue_rows.statuses() if queue.name == "reports"]
    assert (reports.due, reports.held, reports.held_by) == (1, 1, "no_worker")
    call_command("everystep_queues", "--json")
    listed = {queue["name"]: queue for queue in json.loads(capsys.readouterr().out)}
    assert listed["reports"]["held_by"] == "no_worker"
    assert listed["tight"]["concurrency"] == 3
    start_workers(spawn_worker, 1, "--queue", "reports", prefix="reports")
    finished([report.id])


def test_a_higher_priority_is_claimed_first_and_an_aged_run_before_it():
    low = [schedule(queue_workflows.anywhere, 0.0, priority=-5).id for _ in range(3)]
    high = [schedule(queue_workflows.anywhere, 0.0, priority=50).id for _ in range(3)]
    names = [queue_workflows.anywhere.__everystep_workflow__]
    assert {run.fence.run_id for run in claims.claim("p", 3, names)} == set(high)
    # A low one due for longer than the aging goes before any priority.
    aged = timezone.now() - datetime.timedelta(minutes=10)
    Workflow.objects.filter(id=low[2]).update(run_at=aged)
    top = [schedule(queue_workflows.anywhere, 0.0, priority=100).id for _ in range(2)]
    claimed = claims.claim("p", 2, names, aging=300)
    assert {run.fence.run_id for run in claimed} == {low[2], top[0]}


def test_a_priority_first_seen_after_earlier_claims_is_still_claimed_first():
    """A claimer that has seen only priority 0 is not misled by what it saw:
    a run scheduled later at priority 7, or in a queue it never saw, goes
    first in its very next claim."""
    names = [queue_workflows.anywhere.__everystep_workflow__]
    plain = [schedule(queue_workflows.anywhere, 0.0).id for _ in range(4)]
    assert {run.fence.run_id for run in claims.claim("seen", 1, names)} <= set(plain)
    urgent = schedule(queue_workflows.anywhere, 0.0, priority=7).id
    assert [run.fence.run_id for run in claims.claim("seen", 1, names)] == [urgent]
    elsewhere = schedule(queue_workflows.anywhere, 0.0, queue="aaa", priority=9).id
    assert [run.fence.run_id for run in claims.claim("seen", 1, names)] == [elsewhere]
    assert [run.fence.run_id for run in claims.claim("seen", 1, names, ["aaa"])] == []
    rest = {run.fence.run_id for run in claims.claim("seen", 8, names)}
    assert len(rest) == 3 and rest < set(plain)


def test_a_limit_another_process_declares_holds_at_this_ones_next_claim():
    """This process read the queue ``late`` as unlimited; another process
    then declares it with a concurrency of 1 while one of its runs is
    running (a row written here without telling this process). No claim of
    this process takes a second run of it."""
    names = [queue_workflows.anywhere.__everystep_workflow__]
    first = schedule(queue_workflows.anywhere, 0.0, queue="late").id
    second = schedule(queue_workflows.anywhere, 0.0, queue="late").id
    assert len(claims.claim("late", 1, names)) == 1
    claims.limited_queues()  # read now, without the queue ``late``
    QueueRow.objects.create(name="late", concurrency=1)
    assert claims.claim("late", 8, names) == []
    assert claims.claim("late", 8, names, ["late"]) == []
    assert statuses([first, second]) == {"running": 1, "scheduled": 1}


def test_a_workflows_queue_and_priority_are_its_runs_defaults_unless_schedule_says(capsys):
    run = schedule(queue_workflows.report, 0.0)
    assert (run.queue, run.priority) == ("reports", 5)
    moved = schedule(queue_workflows.report, 0.0, queue="tight", priority=-100)
    assert Workflow.objects.filter(id=moved.id, queue="tight", priority=-100).exists()
    call_command("everystep_runs", "--queue", "tight", "--json")
    [listed] = json.loads(capsys.readouterr().out)
    assert (listed["id"], listed["queue"], listed["priority"]) == (str(moved.id), "tight", -100)


def test_the_wake_up_of_a_worker_waiting_for_a_slot(spawn_worker):
    """On PostgreSQL a worker whose queue is at its limit is woken by the
    end of a run that held a slot, not by its next poll (10 s here): the
    held run starts within a second. Elsewhere it starts at the next poll."""
    from everystep.db import runs

    queue_rows.declare([queue_workflows.TIGHT])
    holders = [
        Workflow.objects.create(
            name=queue_workflows.tight.__everystep_workflow__,
            args=[0.0],
            queue="tight",
            status="running",
            claimed_by="elsewhere",
            claim_token=uuid.uuid4(),
        )
        for _ in range(3)
    ]
    poll = "10" if connection.vendor == "postgresql" else "0.5"
    spawn_worker("waiting", "--poll", poll, env=QUEUE_WORKFLOWS).wait_ready()
    held = schedule(queue_workflows.tight, 0.0)
    # For a second, time for its turns to see the run, the full queue holds it.
    settled = time.monotonic() + 1.0
    while time.monotonic() < settled:
        assert Workflow.objects.get(id=held.id).status == "scheduled"
        time.sleep(0.05)
    freed = timezone.now()
    runs.transition([holders[0].id], "running", "completed")
    finished([held.id], timeout=30)
    started = Workflow.objects.get(id=held.id).started_at
    assert started - freed < datetime.timedelta(seconds=1.0 if poll == "10" else 1.5)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: Queue("no spaces"), "must be 1 to 64 letters"),
        (lambda: Queue("x" * 65), "must be 1 to 64 letters"),
        (lambda: Queue("fast", rate="100 per minute"), "a rate must be like '100/m'"),
        (lambda: Queue("fast", rate=(0, 60)), "a rate must be like '100/m'"),
        (lambda: Queue("fast", concurrency=0), "concurrency must be a whole number"),
        (lambda: Queue("tight", concurrency=4), "declared twice with different limits"),
        (lambda: workflow(priority=101)(lambda: None), "priority must be a whole number"),
        (lambda: workflow(queue="a/b")(lambda: None), "must be 1 to 64 letters"),
        (
            lambda: schedule(queue_workflows.per_customer, 0.1),
            "limits runs per concurrency_key",
        ),
        (lambda: schedule(queue_workflows.anywhere, 0, priority=-101), "from -100 to 100"),
        (lambda: schedule(queue_workflows.anywhere, 0, queue=""), "must be 1 to 64"),
    ],
)
def test_bad_queues_rates_and_priorities_are_refused_in_one_line(make, message):
    with pytest.raises(EverystepError, match=message) as raised:
        make()
    assert "\n" not in str(raised.value)
    assert not Workflow.objects.exists()


def test_the_same_queue_declared_again_with_the_same_limits_is_the_same_queue():
    assert Queue("tight", concurrency=3) == queue_workflows.TIGHT
    assert queues.declared()["tight"].describe() == "concurrency 3"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--queue", "nosuch"], "--queue/EVERYSTEP_QUEUES names unknown queue 'nosuch'"),
        (["--queue", "bad name"], "--queue 'bad name' must be 1 to 64 letters"),
        (["--priority-aging", "0"], "--priority-aging '0' must be > 0"),
    ],
)
def test_a_worker_refuses_a_bad_queue_option_in_one_line_with_status_2(args, message):
    done = subprocess.run(
        [sys.executable, "-m", "django", "everystep_worker", *args],
        env=manage_py_environment(QUEUE_WORKFLOWS),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_a_real_prometheus_reads_the_queue_gauges_of_a_worker(
    spawn_worker,
    prometheus_server,  # noqa: F811
):
    schedule(queue_workflows.report, 0.0)
    worker = metrics_worker(
        spawn_worker, "gauged", "--queue", "default", env=QUEUE_WORKFLOWS
    ).wait_ready()
    prometheus = prometheus_server([f"127.0.0.1:{worker.metrics_port}"])
    for query, expected in (
        ('everystep_queue_held{queue="reports", reason="no_worker"}', 1),
        ('everystep_workflows_pending{queue="reports"}', 1),
        ('everystep_queue_limit{queue="tight", kind="concurrency"}', 3),
        ('everystep_queue_limit{queue="metered", kind="rate"}', 4),
        ('everystep_queue_running{queue="default"}', 0),
    ):
        result = prometheus.wait_for(
            query,
            lambda result, expected=expected: result and PrometheusServer.value(result) == expected,
        )
        assert PrometheusServer.value(result) == expected


def test_the_zipapp_schedules_lists_and_serves_queues_and_check_names_the_unserved(
    everystep,  # noqa: F811
    pyz_worker,  # noqa: F811
):
    """The standalone runtime, as a user runs it from outside the repository."""
    modules = "tests.workflows,tests.queue_workflows"
    scheduled = everystep(
        "schedule",
        "report",
        "0",
        "--queue",
        "reports",
        "--priority",
        "7",
        EVERYSTEP_WORKFLOWS=modules,
    )
    assert scheduled.returncode == 0, scheduled.stderr
    run_id = scheduled.stdout.strip()
    assert Workflow.objects.filter(id=run_id, queue="reports", priority=7).exists()
    bad = everystep("schedule", "report", "0", "--priority", "500", EVERYSTEP_WORKFLOWS=modules)
    assert bad.returncode == 2 and "from -100 to 100" in one_line_error(bad)

    worker = pyz_worker("only-default", "--queue", "default", EVERYSTEP_WORKFLOWS=modules)
    worker.wait_ready()
    checked = everystep("check", EVERYSTEP_WORKFLOWS=modules)
    assert (
        "waiting:    1 due run(s) in queue reports: no live worker serves this queue"
        in checked.stdout
    )
    listed = everystep("runs", "--queue", "reports", "--json", EVERYSTEP_WORKFLOWS=modules)
    assert [run["id"] for run in json.loads(listed.stdout)] == [run_id]
    assert everystep("runs", "--queue", "default", "--json").stdout.strip() == "[]"
    table = everystep("queues", EVERYSTEP_WORKFLOWS=modules).stdout
    assert any(
        line.split()[:1] == ["reports"] and "no_worker" in line for line in table.splitlines()
    ), table
    unknown = pyz_worker("typo", "--queue", "reprots", EVERYSTEP_WORKFLOWS=modules)
    assert unknown.wait() == 2
    assert "names unknown queue 'reprots'" in unknown.log()
