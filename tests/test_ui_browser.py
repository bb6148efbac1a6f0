"""The operator UI in a real browser: headless Chromium on the UI mounted in
a Django project (served by pytest-django's live server), every page
rendered without a console error and kept as a screenshot, the step graph
of a workflow with forks, a blocked run resolved by clicking, the runs page
updating itself, and the refusals without login or without the CSRF token.

The pages' queries run on every backend in test_ui_views; the browser's
part is the same on each, so it runs on one."""

import time

import pytest
from django.contrib.auth.models import Permission, User
from django.test import override_settings
from selenium.webdriver.common.by import By

from everystep import schedule
from everystep.models import Workflow
from tests import workflows
from tests.browser import browser, console_errors, screenshot, wait_for, wait_for_text  # noqa: F401
from tests.helpers import blocked_payment, lost_worker, park, run_to_end

pytestmark = [pytest.mark.backends("sqlite"), pytest.mark.django_db(transaction=True)]

LIVE_DEADLINE = 2.0  # SPEC §12: a page updates itself within 2 s of a change


@pytest.fixture
def operator(live_server, browser):  # noqa: F811
    """The browser, logged in through the project's login form as a user
    who may read and act."""
    user = User.objects.create_user("operator", password="correct horse", is_staff=True)
    for codename in ("view_workflow", "change_workflow"):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    browser.get(f"{live_server.url}/everystep/")
    wait_for(browser, lambda d: "/admin/login/" in d.current_url, message="the login form")
    browser.find_element(By.NAME, "username").send_keys("operator")
    browser.find_element(By.NAME, "password").send_keys("correct horse")
    browser.find_element(By.CSS_SELECTOR, "[type=submit]").click()
    wait_for_text(browser, "Runs")
    # The project's own login page has no icon: its 404 is not the UI's.
    assert console_errors(browser, ignore=["/favicon.ico"]) == []
    return browser


def no_console_errors(driver):
    assert console_errors(driver) == []


def live(driver, how):
    """Wait until the page's live updates run by `how` (stream or polling)."""
    wait_for(
        driver,
        lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-live") == how,
        message=f"live updates by {how}",
    )


def test_without_login_the_ui_sends_to_the_login_form_and_shows_nothing(live_server, browser):  # noqa: F811
    browser.get(f"{live_server.url}/everystep/run/{schedule(workflows.quick, 1).id}")
    wait_for(browser, lambda d: "/admin/login/" in d.current_url, message="the login form")
    assert "quick" not in browser.page_source
    screenshot(browser, "ui-login-required")


def test_every_page_renders_and_is_kept_as_a_screenshot(operator, live_server, calls):
    run_to_end(workflows.add_twice, 1, 2)
    run_to_end(workflows.failing_body)
    forked = run_to_end(workflows.nested_forks, 5)
    blocked = blocked_payment(calls)
    schedule(workflows.echo_values, "waiting", idempotency_key="order-42")
    lost_worker("worker-gone")
    park(workflows.quick, 7, worker="worker-gone")
    from everystep.db import workers

    workers.started("worker-1", 4, ["tests.workflows.quick"])

    operator.get(f"{live_server.url}/everystep/")
    wait_for_text(operator, str(forked.id))
    live(operator, "stream")
    assert operator.find_element(By.CSS_SELECTOR, ".count-failed b").text == "1"
    screenshot(operator, "ui-runs")

    operator.get(f"{live_server.url}/everystep/?status=failed")
    rows = operator.find_elements(By.CSS_SELECTOR, "table.runs tbody tr[data-run]")
    assert [row.get_attribute("data-run") for row in rows] == [
        str(run.id) for run in Workflow.objects.filter(status="failed")
    ]
    screenshot(operator, "ui-runs-failed")

    operator.get(f"{live_server.url}/everystep/run/{forked.id}")
    nodes = operator.find_elements(By.CSS_SELECTOR, "#graph g.node")
    assert {node.get_attribute("data-step") for node in nodes} == {
        "1", "2", "2.0.1", "2.0.1.0.1", "2.0.1.1.1", "2.0.1.1.2", "2.1.1", "2.1.named", "3",
    }  # fmt: skip
    assert {node.get_attribute("data-status") for node in nodes} == {"done"}
    assert len(operator.find_elements(By.CSS_SELECTOR, "#graph path.edge")) >= 9
    lanes = operator.find_elements(By.CSS_SELECTOR, "#timeline g.lane text.lane-label")
    assert [lane.text for lane in lanes] == [
        "body",
        "fork 2.0.1, branch 0",
        "fork 2.0.1, branch 1",
        "fork 2, branch 1",
    ]
    operator.execute_script("document.getElementById('graph').scrollIntoView()")
    screenshot(operator, "ui-run-graph")

    operator.get(f"{live_server.url}/everystep/blocked")
    wait_for_text(operator, str(blocked.id))
    screenshot(operator, "ui-blocked")

    operator.get(f"{live_server.url}/everystep/workers")
    wait_for(
        operator,
        lambda d: (
            "Requeue 1 run" in d.find_element(By.CSS_SELECTOR, 'tr[data-worker="worker-gone"]').text
        ),
        message="the lost worker's row with its requeue button",
    )
    screenshot(operator, "ui-workers")
    no_console_errors(operator)


def test_a_body_without_a_fixed_shape_says_why_it_is_drawn_as_recorded(operator, live_server):
    run = run_to_end(workflows.calls_a_helper, 3)
    operator.get(f"{live_server.url}/everystep/run/{run.id}")
    reason = operator.find_element(By.CSS_SELECTOR, "#graph .fallback").text
    assert "doubled_by_a_helper()" in reason
    screenshot(operator, "ui-run-fallback")
    no_console_errors(operator)


def test_a_blocked_run_is_resolved_by_clicking(operator, live_server, calls):
    run = blocked_payment(calls)
    operator.get(f"{live_server.url}/everystep/blocked")
    operator.find_element(By.CSS_SELECTOR, f'tr[data-run="{run.id}"] a.button').click()
    wait_for_text(operator, "Blocked: resolve its uncertain step")
    screenshot(operator, "ui-run-blocked")
    operator.find_element(By.NAME, "result").send_keys('{"charged": 30}')
    operator.find_element(By.NAME, "resolve-result").click()
    wait_for_text(operator, "Resolved: the run is scheduled again.")
    assert operator.find_element(By.ID, "run-status").text == "scheduled"
    run.refresh_from_db()
    assert run.status == Workflow.Status.SCHEDULED
    assert run.steps.get(step_id="1").result == {"charged": 30}
    no_console_errors(operator)


def test_a_run_is_cancelled_and_a_failed_one_retried_by_clicking(operator, live_server):
    run = schedule(workflows.quick, 1, delay=3600)
    operator.get(f"{live_server.url}/everystep/run/{run.id}")
    operator.find_element(By.NAME, "reason").send_keys("ordered twice")
    screenshot(operator, "ui-run-cancel")
    operator.find_element(By.NAME, "cancel").click()
    wait_for_text(operator, "Cancelled.")
    assert operator.find_element(By.ID, "run-status").text == "cancelled"
    assert "ordered twice" in operator.find_element(By.CLASS_NAME, "run-error").text

    failed = run_to_end(workflows.failing_body)
    operator.get(f"{live_server.url}/everystep/run/{failed.id}")
    operator.find_element(By.NAME, "retry").click()
    wait_for_text(operator, "Retried: the run is scheduled again")
    assert operator.find_element(By.ID, "run-status").text == "scheduled"
    assert Workflow.objects.get(id=failed.id).status == Workflow.Status.SCHEDULED
    no_console_errors(operator)


def test_a_form_without_its_csrf_token_is_refused(operator, live_server, calls):
    run = blocked_payment(calls)
    operator.get(f"{live_server.url}/everystep/run/{run.id}")
    operator.execute_script(
        "document.querySelectorAll('[name=csrfmiddlewaretoken]').forEach(e => e.remove())"
    )
    operator.find_element(By.NAME, "resolve-discard").click()
    wait_for_text(operator, "CSRF")
    run.refresh_from_db()
    assert run.status == Workflow.Status.BLOCKED
    console_errors(operator)  # the 403 of the refused form is the expected error


@pytest.mark.parametrize("how", ["stream", "polling"])
def test_the_runs_page_shows_a_new_run_within_2_seconds(operator, live_server, how):
    query = "?live=poll" if how == "polling" else ""
    operator.get(f"{live_server.url}/everystep/{query}")
    live(operator, how)
    run = schedule(workflows.quick, 1)
    scheduled_at = time.monotonic()
    wait_for(
        operator,
        lambda d: d.find_elements(By.CSS_SELECTOR, f'tr[data-run="{run.id}"]'),
        timeout=LIVE_DEADLINE,
        message=f"the new run on the page, by {how}",
    )
    shown_after = time.monotonic() - scheduled_at
    assert shown_after <= LIVE_DEADLINE
    no_console_errors(operator)


def test_a_run_page_follows_the_run_to_its_end(operator, live_server):
    run = schedule(workflows.add_twice, 1, 2)
    operator.get(f"{live_server.url}/everystep/run/{run.id}")
    live(operator, "stream")
    assert operator.find_element(By.ID, "run-status").text == "scheduled"
    from tests.helpers import attempt

    attempt()
    wait_for(
        operator,
        lambda d: d.find_element(By.ID, "run-status").text == "completed",
        timeout=LIVE_DEADLINE,
        message="the run's status to turn completed",
    )
    assert len(operator.find_elements(By.CSS_SELECTOR, "table.steps tbody tr[data-step]")) == 2
    no_console_errors(operator)


@override_settings(EVERYSTEP_UI_PASSWORD="s3cret", EVERYSTEP_UI_READ_ONLY=True)
def test_the_standalone_login_form_and_read_only_mode(live_server, browser, calls):  # noqa: F811
    run = blocked_payment(calls)
    browser.get(f"{live_server.url}/everystep/run/{run.id}")
    wait_for(browser, lambda d: "/everystep/login" in d.current_url, message="the login form")
    screenshot(browser, "ui-standalone-login")
    browser.find_element(By.NAME, "password").send_keys("wrong")
    browser.find_element(By.CSS_SELECTOR, "[type=submit]").click()
    wait_for_text(browser, "Wrong user name or password.")
    console_errors(browser)  # the refused login answers 401: expected
    browser.find_element(By.NAME, "password").send_keys("s3cret")
    browser.find_element(By.CSS_SELECTOR, "[type=submit]").click()
    wait_for_text(browser, f"Run {run.id}")
    assert "read-only" in browser.find_element(By.CSS_SELECTOR, "header.top").text
    assert browser.find_elements(By.NAME, "resolve-result") == []
    screenshot(browser, "ui-standalone-read-only")
    no_console_errors(browser)


def test_the_queues_page_the_queue_filter_and_why_a_due_run_waits(operator, live_server):
    from everystep.db import queues as queue_rows
    from everystep.db import workers
    from tests import queue_workflows

    queue_rows.declare([queue_workflows.TIGHT])
    names = [
        queue_workflows.report.__everystep_workflow__,
        queue_workflows.tight.__everystep_workflow__,
    ]
    workers.started("serves-default", 4, names, ["default", "tight"])
    report = schedule(queue_workflows.report, 0.0)
    for _ in range(3):
        Workflow.objects.create(name=names[1], queue="tight", status="running", claimed_by="x")
    held = schedule(queue_workflows.tight, 0.0)

    operator.get(f"{live_server.url}/everystep/queues")
    rows = {
        row.get_attribute("data-queue"): row.text
        for row in operator.find_elements(By.CSS_SELECTOR, "table.queues tr[data-queue]")
    }
    assert "no live worker serves it" in rows["reports"]
    assert "concurrency 3" in rows["tight"] and "at its concurrency limit" in rows["tight"]
    screenshot(operator, "ui-queues")

    operator.get(f"{live_server.url}/everystep/?queue=reports")
    listed = operator.find_elements(By.CSS_SELECTOR, "table.runs tbody tr[data-run]")
    assert [row.get_attribute("data-run") for row in listed] == [str(report.id)]
    screenshot(operator, "ui-runs-queue")

    operator.get(f"{live_server.url}/everystep/run/{report.id}")
    waiting = operator.find_element(By.ID, "run-waiting").text
    assert waiting == "no live worker serves queue reports"
    screenshot(operator, "ui-run-waiting-for-a-worker")
    operator.get(f"{live_server.url}/everystep/run/{held.id}")
    assert (
        operator.find_element(By.ID, "run-waiting").text == "queue tight at its limit of 3 running"
    )
    no_console_errors(operator)


def test_a_waiting_run_is_sent_a_message_by_clicking_and_a_parent_links_its_child(
    operator, live_server
):
    from everystep.engine import runner
    from tests import wait_workflows
    from tests.helpers import claim_one

    parent = schedule(wait_workflows.parent_of, "tests.wait_workflows.waits_for_go", [])
    runner.execute(claim_one())  # starts the child, waits for it
    child = Workflow.objects.get(parent_id=parent.id)
    runner.execute(claim_one())  # the child waits for a message on "go"

    operator.get(f"{live_server.url}/everystep/?waiting=1")
    listed = operator.find_elements(By.CSS_SELECTOR, "table.runs tbody tr[data-run]")
    assert {row.get_attribute("data-run") for row in listed} == {str(parent.id), str(child.id)}
    screenshot(operator, "ui-runs-waiting")

    operator.get(f"{live_server.url}/everystep/run/{child.id}")
    waits = operator.find_element(By.ID, "run-waits-for").text
    assert waits == "a message on go, no deadline"
    assert operator.find_element(By.ID, "run-parent").text == str(parent.id)
    screenshot(operator, "ui-run-waiting-for-a-message")
    assert operator.find_element(By.NAME, "topic").get_attribute("value") == "go"
    operator.find_element(By.NAME, "payload").send_keys('{"approved": true}')
    operator.find_element(By.NAME, "send").click()
    wait_for(
        operator,
        lambda d: "message on go sent" in d.page_source or "sent" in d.current_url,
        message="the message to be sent",
    )
    runner.execute(claim_one())  # the child receives it and ends
    runner.execute(claim_one())  # its end woke the parent
    assert Workflow.objects.get(id=parent.id).result == ["result", {"approved": True}]

    operator.get(f"{live_server.url}/everystep/run/{child.id}")
    row = operator.find_element(By.CSS_SELECTOR, "#messages tr[data-message]").text
    assert "go" in row and "by step 1" in row
    screenshot(operator, "ui-run-messages")

    operator.get(f"{live_server.url}/everystep/run/{parent.id}")
    children = operator.find_elements(By.CSS_SELECTOR, "#children tr[data-run]")
    assert [c.get_attribute("data-run") for c in children] == [str(child.id)]
    link = operator.find_element(By.CSS_SELECTOR, "#graph a.child-link")
    screenshot(operator, "ui-run-children")
    link.click()
    wait_for(operator, lambda d: str(child.id) in d.current_url, message="the child's page")
    no_console_errors(operator)


def test_a_failed_run_is_forked_by_clicking_and_the_fork_names_its_origin(operator, live_server):
    from tests import patch_workflows
    from tests.helpers import attempt

    patch_workflows.BROKEN["label"] = True
    run = schedule(patch_workflows.dispatch, "G")
    assert attempt() == "failed"
    operator.get(f"{live_server.url}/everystep/run/{run.id}")
    chosen = operator.find_element(By.CSS_SELECTOR, "select[name=from_step] option:checked")
    assert chosen.get_attribute("value") == "2"  # the failed step, by default
    screenshot(operator, "ui-run-fork")
    operator.find_element(By.NAME, "fork").click()
    wait_for(operator, lambda d: "notice=forked" in d.current_url, message="the fork's page")
    forked = Workflow.objects.get(origin_id=run.id)
    assert str(forked.id) in operator.current_url
    assert operator.find_element(By.ID, "run-origin").text == str(run.id)
    screenshot(operator, "ui-run-forked")
    no_console_errors(operator)


def test_the_runs_a_filter_selects_are_cancelled_after_a_confirmation_naming_their_count(
    operator, live_server
):
    selected = [schedule(workflows.quick, n) for n in range(3)]
    other = schedule(workflows.add_twice, 1, 2)
    operator.get(f"{live_server.url}/everystep/?workflow=tests.workflows.quick")
    screenshot(operator, "ui-runs-bulk")
    operator.find_element(By.NAME, "bulk-cancel").click()
    # The runs page's own heading, until the click's page replaces it.
    heading = wait_for(
        operator,
        lambda d: (text := d.find_element(By.TAG_NAME, "h1").text) != "Runs" and text,
        message="the confirmation page",
    )
    assert heading == "Cancel 3 runs?"
    assert Workflow.objects.filter(status=Workflow.Status.CANCELLED).count() == 0
    screenshot(operator, "ui-runs-bulk-confirm")
    operator.find_element(By.NAME, "reason").send_keys("a bad deploy")
    operator.find_element(By.NAME, "confirm").click()
    wait_for(operator, lambda d: "notice=bulk-cancel" in d.current_url, message="the runs again")
    assert {run.status for run in Workflow.objects.filter(id__in=[r.id for r in selected])} == {
        Workflow.Status.CANCELLED
    }
    assert Workflow.objects.get(id=other.id).status == Workflow.Status.SCHEDULED
    assert "Cancelled the runs selected" in operator.find_element(By.CLASS_NAME, "notice").text
    screenshot(operator, "ui-runs-bulk-cancelled")
    no_console_errors(operator)
