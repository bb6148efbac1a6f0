"""Fork (§16): a run broken by a bug resumes on fixed code from the step
where it went wrong; its steps before that one are copied, not run again;
the new run names its origin, and both pages link to each other."""

import io

import pytest
from django.core.management import CommandError, call_command

from everystep import schedule
from everystep.control import actions
from everystep.errors import EverystepError
from everystep.models import Step, Workflow
from tests import patch_workflows
from tests.helpers import attempt, recorded_steps

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _broken():
    patch_workflows.CALLS.clear()
    patch_workflows.BROKEN["label"] = True
    yield
    patch_workflows.BROKEN["label"] = True


def broken_run():
    run = schedule(patch_workflows.dispatch, "F")
    assert attempt() == "failed"
    return run


def test_a_failed_run_forked_from_its_broken_step_resumes_on_fixed_code():
    run = broken_run()
    patch_workflows.BROKEN["label"] = False  # the fix is deployed
    forked = actions.fork(run.id, "2")
    new = Workflow.objects.get(id=forked)
    assert (new.name, new.args, new.status, new.origin_id) == (run.name, ["F"], "scheduled", run.id)
    assert recorded_steps(new) == {"1": ("ship", "done", "shipped F")}
    assert attempt() == "completed"
    assert Workflow.objects.get(id=forked).result == ["shipped F", "label for F"]
    # Shipped once, by the original: the fork replayed it from the copy.
    assert patch_workflows.CALLS.count(("ship", "F")) == 1
    assert Workflow.objects.get(id=run.id).status == "failed"  # the original stays as it was


def test_a_fork_from_the_first_step_copies_nothing():
    run = broken_run()
    forked = actions.fork(run.id, "1")
    assert not Step.objects.filter(workflow_id=forked).exists()


def test_fork_refuses_a_running_run_and_a_step_never_recorded():
    run = broken_run()
    with pytest.raises(EverystepError, match=r"never recorded step 7: its recorded steps are 1, 2"):
        actions.fork(run.id, "7")
    Workflow.objects.filter(id=run.id).update(status="running")
    with pytest.raises(EverystepError, match="is running and may still record steps"):
        actions.fork(run.id, "2")
    assert Workflow.objects.count() == 1


def test_the_fork_command_prints_the_new_run_and_refuses_in_one_line():
    run = broken_run()
    out = io.StringIO()
    call_command("everystep_fork", str(run.id), "--from-step", "2", stdout=out)
    forked = out.getvalue().strip()
    assert Workflow.objects.get(id=forked).origin_id == run.id
    with pytest.raises(CommandError, match="never recorded step x") as refused:
        call_command("everystep_fork", str(run.id), "--from-step", "x")
    assert refused.value.returncode == 2


def test_both_runs_pages_link_to_each_other():
    from django.contrib.auth.models import User
    from django.test import Client

    run = broken_run()
    forked = actions.fork(run.id, "2")
    client = Client()
    client.force_login(User.objects.create_superuser("admin", password="x"))
    origin_page = client.get(f"/everystep/run/{run.id}").content.decode()
    assert f'href="/everystep/run/{forked}"' in origin_page
    fork_page = client.get(f"/everystep/run/{forked}").content.decode()
    assert 'id="run-origin"' in fork_page and f'href="/everystep/run/{run.id}"' in fork_page
