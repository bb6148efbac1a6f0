"""The operator UI mounted in a Django project: who may see and do what,
the pages and the JSON API, actions with their refusals, and bad input
answered with a reason, never a 500."""

import html
import json
import logging
import re

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client, override_settings

from everystep import schedule
from everystep.models import Step, Workflow
from tests import workflows
from tests.helpers import attempt, blocked_payment, lost_worker, park, run_to_end

pytestmark = pytest.mark.django_db(transaction=True)


def user_with(*permissions, name="operator"):
    user = User.objects.create_user(name, password="secret")
    for codename in permissions:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


@pytest.fixture
def viewer():
    client = Client()
    client.force_login(user_with("view_workflow", name="viewer"))
    return client


@pytest.fixture
def operator():
    client = Client(enforce_csrf_checks=True)
    client.force_login(user_with("view_workflow", "change_workflow"))
    return client


def text(response):
    """The response's body as a person reads it (HTML entities decoded)."""
    return html.unescape(response.content.decode())


def submit(client, page_url, action_url, data):
    """POST `data` to `action_url` as the form on `page_url` would: with the
    CSRF token of that page's form (which must be there)."""
    page = text(client.get(page_url))
    assert f'action="{action_url}"' in page, f"no form posts to {action_url} on {page_url}"
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    return client.post(action_url, {**data, "csrfmiddlewaretoken": token})


def test_every_page_needs_a_logged_in_user():
    client = Client()
    for url in ["/everystep/", "/everystep/blocked", "/everystep/workers"]:
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith("/admin/login/?next=")
    for url in ["/everystep/api/runs", "/everystep/api/workers", "/everystep/api/stream"]:
        response = client.get(url)
        assert response.status_code == 401
        assert "error" in response.json()


def test_reading_needs_the_view_permission():
    client = Client()
    client.force_login(user_with(name="nobody"))
    response = client.get("/everystep/")
    assert response.status_code == 403
    assert b"everystep.view_workflow" in response.content
    assert client.get("/everystep/api/runs").status_code == 403


def test_the_runs_page_lists_runs_newest_first_with_counts_per_status(viewer):
    done = run_to_end(workflows.add_twice, 1, 2)
    waiting = schedule(workflows.echo_values, "x")
    response = viewer.get("/everystep/")
    assert response.status_code == 200
    page = response.content.decode()
    assert page.index(str(waiting.id)) < page.index(str(done.id))
    data = viewer.get("/everystep/api/runs").json()
    assert [run["id"] for run in data["runs"]] == [str(waiting.id), str(done.id)]
    assert data["counts"] == {
        "scheduled": 1,
        "running": 0,
        "completed": 1,
        "failed": 0,
        "stopped": 0,
        "blocked": 0,
        "cancelled": 0,
    }
    first = data["runs"][1]
    assert first["steps"] == {"total": 2, "done": 2, "failed": 0}
    assert set(first) >= {"id", "name", "status", "claimed_by", "created_at", "completed_at"}


def test_filters_and_search_narrow_the_list(viewer):
    done = run_to_end(workflows.add_twice, 1, 2)
    keyed = schedule(workflows.echo_values, "k", idempotency_key="order-7")
    parked = park(workflows.quick, 1, worker="w-lost")

    def listed(**query):
        response = viewer.get("/everystep/api/runs", query)
        assert response.status_code == 200, response.content
        return {run["id"] for run in response.json()["runs"]}

    assert listed(status="completed") == {str(done.id)}
    assert listed(workflow=workflows.quick.__everystep_workflow__) == {str(parked.id)}
    assert listed(worker="w-lost") == {str(parked.id)}
    assert listed(q="order-7") == {str(keyed.id)}
    assert listed(q=str(done.id)) == {str(done.id)}
    assert listed(after="2000-01-01T00:00", before="2999-01-01") == {
        str(done.id),
        str(keyed.id),
        str(parked.id),
    }
    assert listed(before="2000-01-01T00:00:00+00:00") == set()


def test_keyset_pages_cover_every_run_once_newest_first(viewer):
    ids = [Workflow.objects.create(name="w").id for _ in range(120)]
    seen, query = [], {}
    while True:
        data = viewer.get("/everystep/api/runs", query).json()
        seen += [run["id"] for run in data["runs"]]
        if not data["next_cursor"]:
            break
        query = {"cursor": data["next_cursor"]}
    assert seen == [str(run_id) for run_id in reversed(ids)]
    assert len(viewer.get("/everystep/").context["data"]["runs"]) == 50


@pytest.mark.parametrize(
    "query, message",
    [
        ({"status": "sleeping"}, "status 'sleeping' is not one of"),
        ({"after": "yesterday"}, "after 'yesterday' is not a time"),
        ({"cursor": "page-2"}, "cursor 'page-2' is not a run id"),
        ({"workflow": "a\x00b"}, "workflow holds a NUL character"),
        ({"q": "x" * 301}, "q is longer than 300 characters"),
    ],
)
def test_a_malformed_filter_is_refused_with_its_reason_never_a_500(viewer, query, message):
    page = viewer.get("/everystep/", query)
    assert page.status_code == 400
    assert message in text(page)
    api = viewer.get("/everystep/api/runs", query)
    assert api.status_code == 400
    assert message in api.json()["error"]


@pytest.mark.parametrize("run_id", ["not-a-uuid", "00000000-0000-0000-0000-000000000000", "%00"])
def test_a_bad_run_id_in_the_url_is_a_404_with_a_reason(viewer, run_id):
    page = viewer.get(f"/everystep/run/{run_id}")
    assert page.status_code == 404
    assert b"problem-message" in page.content
    assert viewer.get(f"/everystep/api/run/{run_id}").status_code == 404


def test_a_run_shows_its_decoded_values_steps_and_graph(viewer):
    run = run_to_end(workflows.nested_forks, 5)
    data = viewer.get(f"/everystep/api/run/{run.id}").json()
    assert data["status"] == "completed"
    assert data["args"] == [5]
    assert data["result"] == 6
    assert {step["step_id"] for step in data["steps"]} == {
        "1", "2.0.1.0.1", "2.0.1.1.1", "2.0.1.1.2", "2.1.1", "2.1.named", "3",
    }  # fmt: skip
    assert all(step["seconds"] is not None for step in data["steps"])
    nodes = {node["id"]: node["status"] for node in data["graph"]["nodes"]}
    assert nodes["2"] == nodes["2.0.1"] == "done"
    assert set(nodes.values()) == {"done"}
    assert data["graph"]["fallback"] is None
    page = viewer.get(f"/everystep/run/{run.id}").content.decode()
    assert 'data-step="2.1.named"' in page and "fork 2.0.1, branch 1" in page


def test_a_body_without_a_fixed_shape_is_drawn_as_recorded_with_the_reason(viewer):
    run = run_to_end(workflows.calls_a_helper, 2)
    graph = viewer.get(f"/everystep/api/run/{run.id}").json()["graph"]
    assert "doubled_by_a_helper()" in graph["fallback"]
    assert [(node["id"], node["status"]) for node in graph["nodes"]] == [("1", "done")]


def test_a_pending_step_after_the_done_ones_of_a_running_run_shows_in_flight(viewer):
    run = park(workflows.add_twice, 1, 2, worker="w-1")
    Step.objects.create(workflow=run, step_id="1", name="tests.workflows.add", status="done")
    nodes = viewer.get(f"/everystep/api/run/{run.id}").json()["graph"]["nodes"]
    assert [(node["id"], node["status"]) for node in nodes] == [("1", "done"), ("2", "in flight")]


def test_a_step_waiting_to_retry_and_a_delayed_run_show_what_they_wait_for(viewer, moved_clock):
    run = run_to_end(workflows.retried_durably, 1)
    data = viewer.get(f"/everystep/api/run/{run.id}").json()
    waiting = data["steps"][1]
    assert (waiting["status"], waiting["attempts"]) == ("retrying", 1)
    nodes = {node["id"]: node["status"] for node in data["graph"]["nodes"]}
    assert nodes == {"1": "done", "2": "waiting"}
    page = html.unescape(viewer.get(f"/everystep/run/{run.id}").content.decode())
    assert "attempt 1 failed, next at" in page and "Flaky: slow: call 1 failed" in page
    assert 'id="run-at"' in page

    delayed = schedule(workflows.quick, 1, delay=3600)
    assert viewer.get(f"/everystep/api/run/{delayed.id}").json()["run_at"] > data["created_at"]


def test_resolving_a_blocked_run_by_its_form_schedules_it_and_logs_who(operator, calls, caplog):
    run = blocked_payment(calls)
    page = operator.get(f"/everystep/run/{run.id}").content.decode()
    assert "Record the result" in page and "Discard and run again" in page
    with caplog.at_level(logging.INFO, logger="everystep.ui"):
        response = submit(
            operator,
            f"/everystep/run/{run.id}",
            f"/everystep/run/{run.id}/resolve",
            {"step_id": "1", "how": "result", "result": '{"charged": 30}'},
        )
    assert response.status_code == 303
    run.refresh_from_db()
    assert run.status == Workflow.Status.SCHEDULED
    assert run.steps.get(step_id="1").result == {"charged": 30}
    [record] = [r for r in caplog.records if getattr(r, "action", "") == "ui_resolve"]
    assert record.user == "operator" and record.run_id == str(run.id)
    assert attempt() == Workflow.Status.COMPLETED
    assert calls["charge"] == 1


def test_cancelling_and_retrying_by_their_buttons_and_the_refusals(operator, viewer, caplog):
    scheduled = schedule(workflows.quick, 1)
    page_url = f"/everystep/run/{scheduled.id}"
    assert "Cancel the run" in operator.get(page_url).content.decode()
    assert "Cancel the run" not in viewer.get(page_url).content.decode()
    with caplog.at_level(logging.INFO, logger="everystep.ui"):
        response = submit(
            operator, page_url, f"{page_url}/cancel", {"reason": "ordered twice", "cancel": ""}
        )
    assert response.status_code == 303 and "notice=cancelled" in response["Location"]
    scheduled.refresh_from_db()
    assert (scheduled.status, scheduled.error["message"]) == ("cancelled", "ordered twice")
    [record] = [r for r in caplog.records if getattr(r, "action", "") == "ui_cancel"]
    assert record.user == "operator" and record.run_id == str(scheduled.id)

    running = park(workflows.quick, 2, worker="busy")
    response = submit(
        operator, f"/everystep/run/{running.id}", f"/everystep/run/{running.id}/cancel", {}
    )
    assert "notice=cancelling" in response["Location"]
    assert "Cancel asked at" in operator.get(f"/everystep/run/{running.id}").content.decode()

    failed = run_to_end(workflows.failing_body)
    failed_url = f"/everystep/run/{failed.id}"
    assert "Cancel the run" not in operator.get(failed_url).content.decode()
    response = submit(operator, failed_url, f"{failed_url}/retry", {})
    assert response.status_code == 303
    assert Workflow.objects.get(id=failed.id).status == "scheduled"

    # A second click, once the run has moved on: refused with the reason.
    refused = operator.post(
        f"{page_url}/cancel",
        {"csrfmiddlewaretoken": operator.cookies["csrftoken"].value},
    )
    assert refused.status_code == 409
    assert "is cancelled: only a scheduled, running or blocked run" in text(refused)


def test_an_action_without_the_csrf_token_is_refused(operator, calls):
    run = blocked_payment(calls)
    response = operator.post(f"/everystep/run/{run.id}/resolve", {"step_id": "1", "how": "discard"})
    assert response.status_code == 403
    run.refresh_from_db()
    assert run.status == Workflow.Status.BLOCKED


def test_acting_needs_the_change_permission(calls):
    run = blocked_payment(calls)
    client = Client()
    client.force_login(user_with("view_workflow", name="reader"))
    assert "Record the result" not in client.get(f"/everystep/run/{run.id}").content.decode()
    response = client.post(f"/everystep/run/{run.id}/resolve", {"step_id": "1", "how": "discard"})
    assert response.status_code == 403
    assert b"everystep.change_workflow" in response.content
    run.refresh_from_db()
    assert run.status == Workflow.Status.BLOCKED


def test_invalid_json_in_the_resolve_form_is_refused_and_the_run_stays_blocked(operator, calls):
    run = blocked_payment(calls)
    response = submit(
        operator,
        f"/everystep/run/{run.id}",
        f"/everystep/run/{run.id}/resolve",
        {"step_id": "1", "how": "result", "result": "{charged: yes"},
    )
    assert response.status_code == 400
    assert "the result is not valid JSON" in text(response)
    run.refresh_from_db()
    assert run.status == Workflow.Status.BLOCKED


def test_an_action_on_a_run_in_the_wrong_state_is_refused_with_the_reason(operator, calls):
    """Two operators open the same blocked run; the second one's form is stale."""
    run = blocked_payment(calls)
    page, action = f"/everystep/run/{run.id}", f"/everystep/run/{run.id}/resolve"
    assert submit(operator, page, action, {"step_id": "1", "how": "discard"}).status_code == 303
    token = operator.cookies["csrftoken"].value
    again = operator.post(action, {"step_id": "1", "how": "discard", "csrfmiddlewaretoken": token})
    assert again.status_code == 409
    assert f"run {run.id} is scheduled, not blocked" in text(again)
    run.refresh_from_db()
    assert run.status == Workflow.Status.SCHEDULED


def test_requeueing_a_lost_workers_runs_puts_them_back_to_scheduled(operator, caplog):
    lost_worker("w-gone")
    parked = park(workflows.quick, 1, worker="w-gone")
    with caplog.at_level(logging.INFO, logger="everystep.ui"):
        response = submit(
            operator, "/everystep/workers", "/everystep/workers/requeue", {"worker": "w-gone"}
        )
    assert response.status_code == 303
    parked.refresh_from_db()
    assert (parked.status, parked.claimed_by) == (Workflow.Status.SCHEDULED, None)
    [record] = [r for r in caplog.records if getattr(r, "action", "") == "ui_requeue"]
    assert (record.user, record.worker, record.count) == ("operator", "w-gone", 1)


def test_requeueing_is_refused_while_the_worker_holds_its_name(operator):
    """Lost by its heartbeat, but alive: it still holds its name lock."""
    from everystep.db.namelock import name_lock

    lost_worker("w-alive")
    parked = park(workflows.quick, 1, worker="w-alive")
    lock = name_lock("w-alive")
    assert lock.try_acquire()
    try:
        response = submit(
            operator, "/everystep/workers", "/everystep/workers/requeue", {"worker": "w-alive"}
        )
    finally:
        lock.release()
    assert response.status_code == 409
    assert "worker 'w-alive' is alive" in text(response)
    parked.refresh_from_db()
    assert parked.status == Workflow.Status.RUNNING


def test_the_workers_page_and_api_show_the_runs_each_holds(viewer):
    from everystep.db import workers

    workers.started("w-9", 4, ["tests.workflows.quick"])
    parked = park(workflows.quick, 1, worker="w-9")
    [worker] = viewer.get("/everystep/api/workers").json()["workers"]
    assert (worker["name"], worker["state"], worker["runs"]) == (
        "w-9",
        "starting",
        [str(parked.id)],
    )
    assert set(worker) >= {"hostname", "pid", "version", "pool_size", "in_flight", "heartbeat_age"}
    assert 'data-worker="w-9"' in viewer.get("/everystep/workers").content.decode()


def test_the_blocked_page_lists_blocked_runs_with_their_uncertain_step(viewer, calls):
    run = blocked_payment(calls)
    page = viewer.get("/everystep/blocked").content.decode()
    assert f'data-run="{run.id}"' in page and "tests.workflows.charge" in page


def test_the_stream_sends_the_views_data_as_a_server_sent_event(viewer):
    run = schedule(workflows.echo_values, "s")
    response = viewer.get("/everystep/api/stream", {"view": "run", "id": str(run.id)})
    assert response["Content-Type"] == "text/event-stream"
    chunks = iter(response.streaming_content)
    assert next(chunks) == b"retry: 1000\n\n"
    event = next(chunks).decode()
    response.close()
    fields = dict(line.split(": ", 1) for line in event.strip().splitlines())
    assert fields["event"] == "change"
    assert json.loads(fields["data"])["id"] == str(run.id)
    assert viewer.get("/everystep/api/stream", {"view": "nope"}).status_code == 400


def test_a_client_that_has_the_latest_data_is_sent_nothing_again(viewer):
    run = schedule(workflows.echo_values, "s")
    query = {"view": "run", "id": str(run.id)}
    first = viewer.get("/everystep/api/stream", query)
    chunks = iter(first.streaming_content)
    next(chunks)
    event_id = next(chunks).decode().splitlines()[0].removeprefix("id: ")
    first.close()
    again = viewer.get("/everystep/api/stream", query, HTTP_LAST_EVENT_ID=event_id)
    chunks = iter(again.streaming_content)
    next(chunks)
    assert next(chunks).startswith(b"event: ping")  # nothing new: the next thing is a ping
    again.close()


def test_the_admin_shows_runs_and_steps_read_only():
    run = run_to_end(workflows.add_twice, 1, 2)
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="x"))
    assert client.get("/admin/everystep/workflow/").status_code == 200
    assert client.get("/admin/everystep/workflow/?status__exact=completed").status_code == 200
    assert client.get(f"/admin/everystep/workflow/{run.id}/change/").status_code == 200
    assert client.get("/admin/everystep/workflow/add/").status_code == 403
    assert client.get("/admin/everystep/step/").status_code == 200


def test_the_assets_are_served_by_the_app_itself(viewer):
    for name, kind in [("htmx.min.js", "javascript"), ("ui.js", "javascript"), ("ui.css", "css")]:
        response = viewer.get(f"/everystep/assets/{name}")
        assert response.status_code == 200 and kind in response["Content-Type"]
    assert viewer.get("/everystep/assets/..%2Fmodels.py").status_code == 404
    assert viewer.get("/everystep/assets/nothing.js").status_code == 404


@override_settings(EVERYSTEP_UI_PASSWORD="s3cret")
def test_with_a_password_the_user_is_admin_by_the_login_form_or_basic_auth():
    client = Client()
    assert client.get("/everystep/").status_code == 302
    api = client.get("/everystep/api/runs")
    assert api.status_code == 401 and api["WWW-Authenticate"].startswith("Basic")
    assert client.post("/everystep/login", {"password": "wrong"}).status_code == 401
    assert client.post("/everystep/login", {"password": "s3cret"}).status_code == 302
    assert client.get("/everystep/").status_code == 200
    basic = Client(HTTP_AUTHORIZATION="Basic YWRtaW46czNjcmV0")  # admin:s3cret
    assert basic.get("/everystep/api/runs").status_code == 200
    wrong = Client(HTTP_AUTHORIZATION="Basic YWRtaW46bm9wZQ==")  # admin:nope
    assert wrong.get("/everystep/api/runs").status_code == 401


@override_settings(EVERYSTEP_UI_PASSWORD="s3cret", EVERYSTEP_UI_READ_ONLY=True)
def test_read_only_removes_every_action(calls):
    run = blocked_payment(calls)
    client = Client(HTTP_AUTHORIZATION="Basic YWRtaW46czNjcmV0")
    page = client.get(f"/everystep/run/{run.id}").content.decode()
    assert "Record the result" not in page and "read-only" in page
    response = client.post(f"/everystep/run/{run.id}/resolve", {"step_id": "1", "how": "discard"})
    assert response.status_code == 403
    run.refresh_from_db()
    assert run.status == Workflow.Status.BLOCKED


def test_a_workers_age_alone_does_not_make_the_stream_send_them_again():
    import datetime

    from django.utils import timezone

    from everystep.db import workers
    from everystep.ui import snapshots

    workers.started("w-steady", 4, ["tests.workflows.quick"])
    now = timezone.now()
    first = snapshots.encoded(snapshots.workers(now))
    later = snapshots.encoded(snapshots.workers(now + datetime.timedelta(seconds=10)))
    assert first[0] != later[0]  # the age shown did change
    assert first[1] == later[1]  # but nothing a page must be sent again for


def _run_of_many_steps(count):
    run = Workflow.objects.create(name="tests.workflows.quick", args=[1], status="completed")
    Step.objects.bulk_create(
        (
            Step(
                workflow=run,
                step_id=str(n),
                name="tests.workflows.echo",
                status="done",
                args=[n],
                kwargs={},
                result=f"value {n}",
            )
            for n in range(1, count + 1)
        ),
        batch_size=5000,
    )
    return run


def test_a_run_of_100000_steps_shows_a_page_of_them_and_draws_none(viewer):
    """A page of 200 steps, links to the others, and no graph or timeline:
    the page stays small whatever the run's length."""
    run = _run_of_many_steps(100_000)
    url = f"/everystep/run/{run.id}"
    response = viewer.get(url)
    page = text(response)
    assert response.status_code == 200
    assert len(response.content) < 1_000_000
    assert page.count("<tr data-step=") == 200
    assert "100000 steps · page 1 of 500" in page
    assert "Not drawn: 100,000 steps, more than the 500 drawn." in page
    assert 'data-step="1"' in page and 'data-step="201"' not in page
    last = text(viewer.get(url, {"page": 500}))
    assert 'data-step="100000"' in last and 'data-step="99800"' not in last
    assert viewer.get(url, {"page": 501}).status_code == 404
    data = json.loads(viewer.get(f"/everystep/api/run/{run.id}", {"page": 2}).content)
    assert (data["steps_total"], data["steps_page"], len(data["steps"])) == (100_000, 2, 200)
    assert data["steps"][0]["step_id"] == "201"


def test_the_run_stream_reads_no_step_values_while_nothing_changes(viewer, monkeypatch):
    """Each tick reads the run's fingerprint (its row and its steps'
    count), not its steps: the page is rebuilt only when that changes."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from everystep.ui import api

    monkeypatch.setattr(api, "TICK", 0.01)
    monkeypatch.setattr(api, "STREAM_SECONDS", 0.5)
    run = _run_of_many_steps(1_000)
    response = viewer.get("/everystep/api/stream", {"view": "run", "id": str(run.id)})
    with CaptureQueriesContext(connection) as queries:
        body = b"".join(response.streaming_content).decode()
    reading_steps = [q["sql"] for q in queries if '"result"' in q["sql"] or "`result`" in q["sql"]]
    assert body.count("event: change") == 1  # the data, once; nothing changed since
    assert len(queries) > 10  # ticked many times...
    assert reading_steps == []  # ...without reading a step's values again


def test_the_workers_page_says_which_worker_recovered_a_silent_workers_runs(viewer):
    from everystep.db import workers

    workers.started("w-gone", 4, ["tests.workflows.quick"])
    workers.recovered("w-gone", "w-rescuer", 2)
    workers.recovered("w-gone", "w-rescuer", 1)
    [worker] = viewer.get("/everystep/api/workers").json()["workers"]
    assert (worker["recovered_by"], worker["recovered_runs"]) == ("w-rescuer", 3)
    page = viewer.get("/everystep/workers").content.decode()
    row = page[page.index('data-worker="w-gone"') :]
    assert re.search(r'class="recovered">3 runs by <span class="mono">w-rescuer</span>', row), row


QUICK = "tests.workflows.quick"


def test_a_bulk_cancel_names_the_count_first_and_acts_once_confirmed(operator, caplog):
    selected = [schedule(workflows.quick, n) for n in range(3)]
    other = schedule(workflows.add_twice, 1, 2)
    confirm = submit(
        operator, f"/everystep/?workflow={QUICK}", "/everystep/runs/cancel", {"workflow": QUICK}
    )
    assert confirm.status_code == 200
    assert "Cancel 3 runs?" in text(confirm) and 'name="confirmed" value="3"' in text(confirm)
    assert statuses(selected) == {Workflow.Status.SCHEDULED}  # nothing changed yet

    with caplog.at_level(logging.INFO, logger="everystep.ui"):
        done = confirmed(
            operator, confirm, "/everystep/runs/cancel", {"workflow": QUICK, "reason": "late"}
        )
    assert done.status_code == 303
    assert done["Location"].endswith(f"?workflow={QUICK}&notice=bulk-cancel")
    assert statuses(selected) == {Workflow.Status.CANCELLED}
    assert statuses([other]) == {Workflow.Status.SCHEDULED}
    [record] = [r for r in caplog.records if getattr(r, "action", "") == "ui_bulk_cancel"]
    assert (record.user, record.count, record.selection) == ("operator", 3, f"workflow={QUICK}")
    assert "Cancelled the runs selected" in text(operator.get(done["Location"]))


def test_a_bulk_retry_whose_count_changed_since_the_confirmation_asks_again(operator):
    failed = [run_to_end(workflows.failing_body) for _ in range(2)]
    form = {"status": "failed", "confirmed": "1"}  # one failed run when the page was shown
    asked = submit(operator, "/everystep/?status=failed", "/everystep/runs/retry", form)
    assert asked.status_code == 200 and "Retry 2 runs?" in text(asked)
    assert statuses(failed) == {Workflow.Status.FAILED}
    done = confirmed(operator, asked, "/everystep/runs/retry", {"status": "failed"})
    assert done.status_code == 303
    assert statuses(failed) == {Workflow.Status.SCHEDULED}


@pytest.mark.parametrize(
    ("form", "status", "reason"),
    [
        ({}, 400, "choose a filter first"),
        ({"status": "completed"}, 400, "a completed run is not cancelled"),
        ({"after": "yesterday"}, 400, "after 'yesterday' is not a time"),
    ],
)
def test_a_bulk_action_without_a_usable_filter_is_refused(operator, form, status, reason):
    run = schedule(workflows.quick, 1)
    response = submit(operator, "/everystep/?status=scheduled", "/everystep/runs/cancel", form)
    assert response.status_code == status and reason in text(response), text(response)
    assert statuses([run]) == {Workflow.Status.SCHEDULED}


def test_a_bulk_action_needs_the_csrf_token_and_the_right_to_act(operator, viewer):
    run = schedule(workflows.quick, 1)
    form = {"workflow": QUICK, "confirmed": "1"}
    assert operator.post("/everystep/runs/cancel", form).status_code == 403  # no CSRF token
    assert viewer.post("/everystep/runs/cancel", form).status_code == 403
    assert 'action="/everystep/runs/cancel"' not in text(
        viewer.get(f"/everystep/?workflow={QUICK}")
    )
    operator.get(f"/everystep/?workflow={QUICK}")  # its form sets the CSRF cookie
    token = operator.cookies["csrftoken"].value
    with override_settings(EVERYSTEP_UI_READ_ONLY=True):
        page = text(operator.get(f"/everystep/?workflow={QUICK}"))
        assert 'action="/everystep/runs/cancel"' not in page
        refused = operator.post("/everystep/runs/cancel", {**form, "csrfmiddlewaretoken": token})
        assert refused.status_code == 403 and "read-only" in text(refused)
    assert statuses([run]) == {Workflow.Status.SCHEDULED}


def confirmed(client, confirmation, action_url, data):
    """POST `data` to `action_url` as the confirmation page's form does: with
    its token and the count it names."""
    page = text(confirmation)
    assert f'action="{action_url}"' in page, page
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    count = re.search(r'name="confirmed" value="(\d+)"', page).group(1)
    return client.post(action_url, {**data, "confirmed": count, "csrfmiddlewaretoken": token})


def statuses(runs):
    return set(
        Workflow.objects.filter(id__in=[run.id for run in runs]).values_list("status", flat=True)
    )
