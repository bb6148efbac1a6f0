"""What operators read and do (§10, §11): the workers table, runs waiting
for a workflow no live worker has, and requeue's refusal of a live worker."""

import datetime
import os

import pytest
from django.utils import timezone

from everystep import schedule
from everystep.control import actions
from everystep.db import reads, workers
from everystep.errors import EverystepError
from everystep.models import Worker, Workflow
from tests import workflows
from tests.helpers import park, wait_until
from tests.workerproc import stop_embedded

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_worker_records_itself_its_workflows_and_its_state(embedded_worker):
    worker = embedded_worker(name="recorded", pool_size=3)
    row = wait_until(
        lambda: Worker.objects.filter(name="recorded", state="ready").first(),
        message="the worker's row ready",
    )
    assert (row.pid, row.pool_size) == (os.getpid(), 3)
    assert workflows.quick.__everystep_workflow__ in row.workflows
    assert list(workers.live_workers().values_list("name", flat=True)) == ["recorded"]
    stop_embedded(worker)
    row.refresh_from_db()
    assert row.state == "stopped" and row.stopped_at is not None
    assert not workers.live_workers().exists()


def test_runs_of_a_workflow_no_live_worker_has_are_listed_as_unclaimable(embedded_worker):
    worker = embedded_worker(name="older-deploy")
    wait_until(lambda: workers.live_workers().exists(), message="a live worker")
    newer = Workflow.objects.create(name="newer.module.workflow", args=[1])
    known = schedule(workflows.quick, 2)
    wait_until(lambda: Workflow.objects.get(id=known.id).status == "completed")
    assert reads.unclaimable() == {"newer.module.workflow": 1}
    assert Workflow.objects.get(id=newer.id).status == "scheduled"  # waits, never fails

    stop_embedded(worker)

    lost = timezone.now() - datetime.timedelta(seconds=Worker.LOST_AFTER + 1)
    Worker.objects.filter(name="older-deploy").update(state="ready", heartbeat_at=lost)
    waiting = schedule(workflows.quick, 3)
    assert not workers.live_workers().exists()
    assert reads.unclaimable() == {"newer.module.workflow": 1, waiting.name: 1}


def test_requeue_is_refused_while_the_worker_is_alive_and_holds_its_name(embedded_worker):
    parked = park(workflows.quick, 1, worker="alive")
    worker = embedded_worker(name="alive", catchup=False)
    wait_until(lambda: Worker.objects.filter(name="alive", state="ready").exists())
    with pytest.raises(actions.WorkerAlive, match="'alive' is alive"):
        actions.requeue(claimed_by="alive")
    with pytest.raises(actions.WorkerAlive):
        actions.requeue([str(parked.id)])
    stop_embedded(worker)

    assert actions.requeue(claimed_by="alive") == [parked.id]
    parked.refresh_from_db()
    assert (parked.status, parked.claimed_by) == ("scheduled", None)


def test_requeue_refuses_a_run_claimed_by_another_worker_while_it_took_the_names_lock(
    monkeypatch,
):
    """The race: between requeue's first read and the lock on the dead
    worker's name, the run was requeued and claimed by a live worker. The
    run stays with the live worker, and nothing is requeued."""
    import contextlib

    parked = park(workflows.quick, 1, worker="dead")
    other = park(workflows.quick, 2, worker="dead")
    taking_the_lock = actions._holding_name

    @contextlib.contextmanager
    def meanwhile_claimed_elsewhere(name):
        Workflow.objects.filter(id=parked.id).update(claimed_by="alive-elsewhere")
        with taking_the_lock(name):
            yield

    monkeypatch.setattr(actions, "_holding_name", meanwhile_claimed_elsewhere)
    with pytest.raises(
        EverystepError, match=f"run {parked.id} is now held by worker alive-elsewhere"
    ):
        actions.requeue([str(parked.id), str(other.id)])
    assert set(Workflow.objects.values_list("status", "claimed_by")) == {
        ("running", "alive-elsewhere"),
        ("running", "dead"),
    }


def test_django_projects_have_requeue_as_a_management_command(embedded_worker):
    import io

    from django.core.management import CommandError, call_command

    parked = park(workflows.quick, 1, worker="crashed")
    worker = embedded_worker(name="crashed", catchup=False)
    wait_until(lambda: Worker.objects.filter(name="crashed", state="ready").exists())
    with pytest.raises(CommandError, match="is alive") as refused:
        call_command("everystep_requeue", claimed_by="crashed")
    assert refused.value.returncode == 2
    stop_embedded(worker)

    out, err = io.StringIO(), io.StringIO()
    call_command("everystep_requeue", str(parked.id), stdout=out, stderr=err)
    assert out.getvalue().split() == [str(parked.id)]
    assert "1 run(s) requeued" in err.getvalue()
    assert Workflow.objects.get(id=parked.id).status == "scheduled"
