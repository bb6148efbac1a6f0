"""Retention (§16): `prune --older-than` deletes the runs that ended long
enough ago with their steps, messages and events, a batch at a time;
failed and blocked runs are kept unless named; bad input is one line."""

import datetime
import io

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from everystep.control import actions
from everystep.db import retention
from everystep.models import Event, Message, Step, Workflow

pytestmark = pytest.mark.django_db(transaction=True)

DAY = 86_400
NAME = "tests.workflows.quick"


def ended(status, days_ago, name=NAME, steps=0):
    run = Workflow.objects.create(
        name=name, status=status, completed_at=timezone.now() - datetime.timedelta(days=days_ago)
    )
    Step.objects.bulk_create(
        Step(workflow=run, step_id=str(i + 1), name="tests.workflows.add", status="done")
        for i in range(steps)
    )
    return run


def remaining():
    return set(Workflow.objects.values_list("id", flat=True))


def test_prune_deletes_old_finished_runs_with_their_records_and_keeps_the_rest():
    old = ended("completed", 40, steps=3)
    Message.objects.create(workflow=old, topic="payment", payload=1)
    Event.objects.create(workflow=old, key="progress", value=1, step_id="1")
    stopped, cancelled = ended("stopped", 31), ended("cancelled", 35)
    recent = ended("completed", 10)
    failed, blocked = ended("failed", 40), ended("blocked", 40)
    waiting = Workflow.objects.create(name=NAME)  # scheduled: never pruned

    assert actions.prune(30 * DAY, dry_run=True) == 3
    assert len(remaining()) == 7
    assert actions.prune(30 * DAY) == 3
    assert remaining() == {recent.id, failed.id, blocked.id, waiting.id}
    assert not Step.objects.exists()
    assert not Message.objects.exists() and not Event.objects.exists()

    assert actions.prune(30 * DAY, ["failed", "blocked"]) == 2
    assert remaining() == {recent.id, waiting.id}
    assert stopped.id not in remaining() and cancelled.id not in remaining()


def test_prune_takes_one_workflow_when_told():
    mine = ended("completed", 40, name="shop.checkout")
    other = ended("completed", 40)
    assert actions.prune(DAY, workflow="shop.checkout") == 1
    assert remaining() == {other.id}
    assert mine.id not in remaining()


def test_a_batch_holds_at_most_its_rows_and_a_big_run_goes_alone():
    small = Workflow.objects.bulk_create(
        Workflow(
            name=NAME, status="completed", completed_at=timezone.now() - datetime.timedelta(days=9)
        )
        for _ in range(1_200)
    )
    big = ended("completed", 8, steps=1_500)
    batches = []
    deleted = actions.prune(DAY, progress=batches.append)
    assert deleted == len(small) + 1
    sizes = [after - before for before, after in zip([0, *batches], batches, strict=False)]
    limit = retention.batch_rows()
    assert limit <= 1_000  # SPEC §16
    full, rest = divmod(len(small), limit)
    assert sizes == [limit] * full + ([rest] if rest else []) + [1]  # the big run alone, last
    assert big.id not in remaining()


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--older-than", "0"], "--older-than must be more than 0"),
        (["--older-than", "soon"], "'soon' is not a duration"),
        (
            ["--older-than", "30d", "--status", "running"],
            "status 'running' is not a finished run's",
        ),
        (["--older-than", "30d", "--status", "nope"], "status 'nope' is not a finished run's"),
    ],
)
def test_bad_input_is_one_line_with_status_2(arguments, message):
    ended("completed", 40)
    with pytest.raises(CommandError, match=message) as refused:
        call_command("everystep_prune", *arguments)
    assert refused.value.returncode == 2
    assert "\n" not in str(refused.value)
    assert Workflow.objects.count() == 1


def test_the_management_command_prints_the_count():
    ended("completed", 40)
    out = io.StringIO()
    call_command("everystep_prune", "--older-than", "30d", "--dry-run", stdout=out)
    assert out.getvalue().strip() == "1 run(s) would be deleted"
    call_command("everystep_prune", "--older-than", "30d", stdout=out)
    assert out.getvalue().strip().endswith("1 run(s) deleted")
    assert not Workflow.objects.exists()


def test_the_zipapp_prunes(pyz, tmp_path):
    from tests.zipapp import run_pyz, workflow_environment

    ended("completed", 40)
    ended("failed", 40)
    result = run_pyz(pyz, "prune", "--older-than", "30d", env=workflow_environment(), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1 run(s) deleted"
    assert list(Workflow.objects.values_list("status", flat=True)) == ["failed"]
