"""Bulk actions (§16): `cancel` and `retry` take filters instead of a run
id, with `--dry-run`; each run is changed as one by one would change it;
"everything" must be said with `--all`; bad input is one line, status 2."""

import io

import pytest
from django.core.management import CommandError, call_command

from everystep.models import Workflow

pytestmark = pytest.mark.django_db(transaction=True)

QUICK, OTHER = "tests.workflows.quick", "tests.workflows.add_twice"


def runs(name, status, count=1):
    return [
        Workflow.objects.create(
            name=name, status=status, claimed_by="w" if status == "running" else None
        ).id
        for _ in range(count)
    ]


def command(*args):
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue().strip()


def statuses(ids):
    return sorted(Workflow.objects.filter(id__in=ids).values_list("status", flat=True))


def test_cancel_by_workflow_changes_each_run_as_one_by_one_would():
    waiting, blocked, running = (
        runs(QUICK, "scheduled", 3),
        runs(QUICK, "blocked"),
        runs(QUICK, "running"),
    )
    done = runs(QUICK, "completed")
    other = runs(OTHER, "scheduled")

    out, summary = command("everystep_cancel", "--workflow", QUICK, "--dry-run")
    assert summary == "5 run(s) would be cancelled or asked to stop"
    assert len(out.splitlines()) == 5
    assert statuses(waiting + blocked + running) == [
        "blocked",
        "running",
        "scheduled",
        "scheduled",
        "scheduled",
    ]

    out, summary = command("everystep_cancel", "--workflow", QUICK, "--reason", "bad deploy")
    assert summary == "5 run(s) cancelled or asked to stop"
    assert statuses(waiting + blocked) == ["cancelled"] * 4
    [asked] = Workflow.objects.filter(id__in=running)
    assert asked.status == "running" and asked.cancel_requested_at is not None  # at its next step
    assert asked.error["message"] == "bad deploy"
    assert statuses(done + other) == ["completed", "scheduled"]


def test_retry_by_status_and_queue_retries_only_failed_runs():
    failed = runs(QUICK, "failed", 2)
    elsewhere = Workflow.objects.create(name=QUICK, status="failed", queue="reports").id
    others = runs(QUICK, "completed") + runs(QUICK, "scheduled")
    _, summary = command("everystep_retry", "--queue", "default")
    assert summary == "2 run(s) scheduled again"
    assert statuses(failed) == ["scheduled", "scheduled"]
    assert statuses([elsewhere]) == ["failed"]
    assert statuses(others) == ["completed", "scheduled"]


def test_everything_must_be_said_with_all():
    waiting = runs(QUICK, "scheduled") + runs(OTHER, "scheduled")
    with pytest.raises(CommandError, match="to act on every run, say --all") as refused:
        command("everystep_cancel")
    assert refused.value.returncode == 2
    assert statuses(waiting) == ["scheduled", "scheduled"]
    _, summary = command("everystep_cancel", "--all")
    assert summary == "2 run(s) cancelled or asked to stop"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["everystep_cancel", "--status", "failed"], "a failed run is not cancelled"),
        (["everystep_cancel", "--status", "nope"], "status 'nope' is not one of"),
        (["everystep_retry", "--status", "completed"], "a completed run is not retried"),
        (["everystep_retry", "--since", "yesterday"], "--since 'yesterday' is neither a time"),
        (
            ["everystep_cancel", "00000000-0000-7000-8000-000000000000", "--all"],
            "give a run id, or filters",
        ),
    ],
)
def test_bad_bulk_input_is_one_line_with_status_2(arguments, message):
    waiting = runs(QUICK, "scheduled") + runs(QUICK, "failed")
    with pytest.raises(CommandError, match=message) as refused:
        command(*arguments)
    assert refused.value.returncode == 2
    assert "\n" not in str(refused.value)
    assert statuses(waiting) == ["failed", "scheduled"]


def test_the_zipapp_cancels_by_filter(pyz, tmp_path):
    from tests.zipapp import run_pyz, workflow_environment

    waiting = runs(QUICK, "scheduled", 2)
    env = workflow_environment()
    dry = run_pyz(pyz, "cancel", "--workflow", QUICK, "--dry-run", env=env, cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert "2 run(s) would be cancelled" in dry.stderr
    done = run_pyz(pyz, "cancel", "--workflow", QUICK, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert statuses(waiting) == ["cancelled", "cancelled"]
    refused = run_pyz(pyz, "retry", env=env, cwd=tmp_path)
    assert refused.returncode == 2
    from tests.zipapp import one_line_error

    assert "say --all" in one_line_error(refused)
