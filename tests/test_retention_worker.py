"""The workers' own pruning (§16): with a retention a worker prunes at
start and then hourly, one worker at a time; a bad retention is one line,
status 2."""

import datetime

import pytest
from django.utils import timezone

from everystep.db.namelock import name_lock
from everystep.models import Workflow
from everystep.worker import retention
from tests.helpers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def ended(status, hours_ago):
    return Workflow.objects.create(
        name="tests.workflows.quick",
        status=status,
        completed_at=timezone.now() - datetime.timedelta(hours=hours_ago),
    ).id


def test_a_worker_with_a_retention_prunes_the_old_finished_runs(embedded_worker):
    old, kept_failed, recent = ended("completed", 3), ended("failed", 3), ended("completed", 0.5)
    embedded_worker(name="pruning", retention=3600)
    wait_until(
        lambda: not Workflow.objects.filter(id=old).exists(), message="the old run to be pruned"
    )
    assert set(Workflow.objects.values_list("id", flat=True)) == {kept_failed, recent}


def test_a_round_is_left_to_the_worker_already_pruning():
    old = ended("completed", 3)
    pruner = retention.Pruner(3600)
    other = name_lock(retention.LOCK_NAME)
    assert other.try_acquire()
    try:
        assert pruner.round() is None
        assert Workflow.objects.filter(id=old).exists()
    finally:
        other.release()
    assert pruner.round() == 1
    assert not Workflow.objects.filter(id=old).exists()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--retention", "0"], "--retention '0' must be more than 0"),
        (["--retention", "soon"], "--retention 'soon' is not a duration"),
    ],
)
def test_a_bad_retention_exits_2_with_one_line(spawn_worker, flags, message):
    worker = spawn_worker("misconfigured", *flags)
    assert worker.wait() == 2
    lines = worker.log().strip().splitlines()
    assert len(lines) == 1 and message in lines[0], worker.log()
