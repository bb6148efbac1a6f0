"""What a worker sets up for its whole process before it starts
(`everystep.worker.process`), seen from the runs it executes."""

import pytest

from everystep import schedule
from everystep.models import Workflow
from tests import workflows
from tests.helpers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def finished(run):
    row = Workflow.objects.get(id=run.id)
    return row if row.status in (Workflow.Status.COMPLETED, Workflow.Status.FAILED) else None


def test_a_worker_freezes_what_its_start_loaded_and_runs_steps_with_the_collector_on(
    spawn_worker,
):
    """A full collection walks only what the worker made since its start:
    the objects the start loaded are frozen out of the collector's reach,
    and the collector is on while the runs execute."""
    worker = spawn_worker("frozen").wait_ready()
    run = schedule(workflows.collector_state)
    row = wait_until(lambda: finished(run), timeout=60, message="the run to finish")
    assert row.status == Workflow.Status.COMPLETED, (row.error, worker.log())
    assert row.result["enabled"] is True
    assert row.result["frozen"] > workflows.FROZEN_AT_THE_START, row.result
