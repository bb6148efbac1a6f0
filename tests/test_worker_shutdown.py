"""Stopping a worker: SIGTERM drains at step boundaries; the deadline requeues
what is left; nothing claimed is lost."""

import signal
import subprocess
import sys

import pytest

from everystep import schedule
from everystep.models import Step, Workflow
from tests import workflows
from tests.helpers import opened, started, wait_until
from tests.workerproc import timed_wait

pytestmark = pytest.mark.django_db(transaction=True)


def test_sigterm_mid_step_records_the_step_requeues_the_run_and_another_name_completes_it(
    spawn_worker, tmp_path
):
    gates = tmp_path
    run = schedule(workflows.gated, str(gates))
    first = spawn_worker("first", "--drain", "60").wait_ready()
    started(gates, "first")

    first.send(signal.SIGTERM)
    first.wait_for_log("draining")
    opened(gates, "first")  # the in-flight step may now finish
    code, _ = timed_wait(first, 60)
    assert code == 0, first.log()

    run.refresh_from_db()
    assert (run.status, run.claimed_by) == (Workflow.Status.SCHEDULED, None)
    assert [(s.step_id, s.status) for s in run.steps.all()] == [("1", Step.Status.DONE)]
    assert not (gates / "second.started").exists()  # no new step started while draining

    opened(gates, "second")
    second = spawn_worker("second").wait_ready()
    wait_until(lambda: Workflow.objects.get(id=run.id).status == Workflow.Status.COMPLETED)
    run.refresh_from_db()
    assert run.claimed_by == "second"
    assert run.result == [1, 1]  # each gate passed exactly once
    second.send(signal.SIGTERM)
    assert second.wait() == 0


def test_at_the_drain_deadline_leftovers_are_requeued_and_the_worker_exits(spawn_worker, tmp_path):
    run = schedule(workflows.gated, str(tmp_path))
    worker = spawn_worker("short", "--drain", "1").wait_ready()
    started(tmp_path, "first")

    worker.send(signal.SIGTERM)
    code, seconds = timed_wait(worker, 30)
    assert code == 0, worker.log()
    assert seconds < 1 + 5, f"took {seconds:.1f}s to exit with --drain 1"
    assert "requeued at the drain deadline" in worker.log()
    run.refresh_from_db()
    assert (run.status, run.claimed_by) == (Workflow.Status.SCHEDULED, None)
    assert not run.steps.exists()  # the step never finished: nothing recorded


def test_drain_zero_waits_for_the_step_however_long(spawn_worker, tmp_path):
    run = schedule(workflows.gated, str(tmp_path))
    worker = spawn_worker("patient", "--drain", "0").wait_ready()
    started(tmp_path, "first")

    worker.send(signal.SIGTERM)
    worker.wait_for_log("draining")
    with pytest.raises(subprocess.TimeoutExpired):  # still waiting: it did not give up
        worker.process.wait(3)
    assert worker.alive()
    opened(tmp_path, "first")
    assert worker.wait(30) == 0
    run.refresh_from_db()
    assert run.status == Workflow.Status.SCHEDULED
    assert run.steps.get().step_id == "1"


def test_a_second_signal_cuts_the_drain_short(spawn_worker, tmp_path):
    run = schedule(workflows.gated, str(tmp_path))
    worker = spawn_worker("impatient", "--drain", "0").wait_ready()
    started(tmp_path, "first")
    worker.send(signal.SIGINT)
    worker.wait_for_log("draining")
    worker.send(signal.SIGINT)
    assert worker.wait(30) == 0
    run.refresh_from_db()
    assert (run.status, run.claimed_by) == (Workflow.Status.SCHEDULED, None)


def test_a_stopped_idle_worker_exits_at_once_and_leaves_nothing_claimed(spawn_worker):
    runs = [schedule(workflows.quick, n).id for n in range(5)]
    worker = spawn_worker("idle").wait_ready()
    wait_until(lambda: Workflow.objects.filter(id__in=runs, status="completed").count() == 5)
    worker.send(signal.SIGTERM)
    code, seconds = timed_wait(worker, 30)
    assert code == 0 and seconds < 5
    assert not Workflow.objects.filter(claimed_by="idle", status="running").exists()


# A process whose main thread waits as the worker loop does — in and out of
# an Event's lock, every few microseconds — while another thread sends it
# stop signals, SIGINT and SIGTERM in turn. The handler must never wait for a
# lock the interrupted main thread holds: it would wait forever.
SIGNALLED_WHILE_WAITING = """
import os, signal, sys, threading, time, types
import django
django.setup()
from everystep.worker.shutdown import Shutdown

woken = threading.Event()
shutdown = Shutdown(types.SimpleNamespace(name="hammered", drain=0), woken.set)
undo = shutdown.install_signal_handlers(pool=None)
sent = threading.Event()

def send():
    for n in range(int(sys.argv[1])):
        os.kill(os.getpid(), (signal.SIGINT, signal.SIGTERM)[n % 2])
        time.sleep(0.0005)
    sent.set()

threading.Thread(target=send).start()
while not sent.is_set():
    woken.wait(0)
    woken.clear()
undo()
print(*(name for name in ("requested", "hurried") if getattr(shutdown, name).is_set()))
"""


def test_stop_signals_that_land_while_the_loop_holds_its_wait_lock_never_hang_it(tmp_path):
    from tests.workerproc import REPO, manage_py_environment

    env = {**manage_py_environment(), "PYTHONFAULTHANDLER": "1"}
    try:
        done = subprocess.run(
            [sys.executable, "-c", SIGNALLED_WHILE_WAITING, "1000"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the process hung:\n{exc.stderr}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["requested", "hurried"]
    # Answered on the signals' own thread, each logged (the same signal sent
    # again before the first was delivered is delivered once: POSIX).
    answered = done.stderr.splitlines()
    assert len(answered) > 300
    assert all(" received SIG" in line for line in answered), done.stderr[-3000:]
