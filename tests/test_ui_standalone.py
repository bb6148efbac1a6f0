"""`everystep ui` as an operator runs it: the built zipapp, started from a
directory outside the repository on the suite's database, configured only
by its environment. Bad configuration exits 2 in one line; the UI is
behind its password (form or basic auth), serves its JSON API, its assets
and its live stream, keeps its secrets out of the log, honours read-only,
and stops cleanly on SIGTERM or SIGINT with a stream open."""

import json
import signal
import socket
import time
import uuid

import pytest

from everystep import schedule
from tests import workflows
from tests.helpers import database_url, lost_worker, park, run_to_end, url_with_password
from tests.servers import free_port
from tests.uiprocess import STOP_DEADLINE, run_ui, stop
from tests.workerproc import REPO
from tests.zipapp import clean_environment, one_line_error, run_pyz, workflow_environment

pytestmark = pytest.mark.django_db(transaction=True)

# What does not depend on the database server — the command line's refusals,
# the login form, the assets, the signals, read-only — runs on one backend;
# listing runs, the stream and the secrets in the log run on every one.
ANY_BACKEND = pytest.mark.backends("sqlite")

STATIC = REPO / "everystep" / "static" / "everystep"
LIVE_DEADLINE = 2.0  # seconds from a change to its event (SPEC §12)


@ANY_BACKEND
@pytest.mark.parametrize("password", [None, ""], ids=["unset", "empty"])
def test_without_a_password_ui_exits_2_with_one_line_naming_everystep_ui_password(
    pyz, tmp_path, password
):
    """Without EVERYSTEP_UI_PASSWORD the UI refuses to start, in one line."""
    env = workflow_environment()
    if password is not None:
        env["EVERYSTEP_UI_PASSWORD"] = password
    result = run_pyz(pyz, "ui", "--port", free_port(), env=env, cwd=tmp_path, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "EVERYSTEP_UI_PASSWORD" in one_line_error(result)
    assert result.stdout == ""


@ANY_BACKEND
@pytest.mark.parametrize(
    "flags, variables, fragment",
    [
        ([], {"EVERYSTEP_UI_READ_ONLY": "maybe"}, "EVERYSTEP_UI_READ_ONLY='maybe'"),
        ([], {"EVERYSTEP_UI_READ_ONLY": "ture"}, "EVERYSTEP_UI_READ_ONLY='ture'"),
        ([], {"EVERYSTEP_UI_PORT": "http"}, "EVERYSTEP_UI_PORT='http'"),
        ([], {"EVERYSTEP_UI_PORT": "0"}, "EVERYSTEP_UI_PORT='0'"),
        ([], {"EVERYSTEP_UI_PORT": "65536"}, "EVERYSTEP_UI_PORT='65536'"),
        (["--port", "abc"], {}, "--port"),
        (["--port", "0"], {}, "--port"),
        (["--port", "70000"], {}, "--port"),
    ],
)
def test_a_bad_read_only_flag_or_port_exits_2_with_one_line_naming_it(
    pyz, tmp_path, flags, variables, fragment
):
    """A bad EVERYSTEP_UI_READ_ONLY, EVERYSTEP_UI_PORT or --port is refused in one line."""
    result = run_ui(pyz, tmp_path, *flags, **variables)
    assert result.returncode == 2, result.stdout + result.stderr
    assert fragment in one_line_error(result)


@ANY_BACKEND
def test_a_port_already_in_use_exits_2_with_one_line_saying_it_cannot_listen(pyz, tmp_path):
    """A port another process listens on is refused in one line naming it."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_ui(pyz, tmp_path, "--port", port)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in one_line_error(result)


def test_every_page_needs_the_password_and_the_api_lists_runs_by_basic_auth(
    start_ui, pyz, tmp_path
):
    """Pages redirect to the login, the API answers 401 Basic; admin and the
    password by basic auth get the runs with their step counts."""
    finished = run_to_end(workflows.with_cleanup)  # one failed step, one done
    ui = start_ui()
    scheduled = run_pyz(pyz, "schedule", "quick", "7", env=workflow_environment(), cwd=tmp_path)
    assert scheduled.returncode == 0, scheduled.stderr
    scheduled_id = scheduled.stdout.strip()

    anonymous = ui.client()
    page = anonymous.get("/")
    assert page.status == 302 and page.headers["Location"].startswith("/login?next=/")
    refused = anonymous.get("/api/runs")
    assert refused.status == 401 and "error" in refused.json()
    assert refused.headers["WWW-Authenticate"].startswith("Basic ")
    assert ui.client(basic=True, password="not-" + ui.password).get("/api/runs").status == 401
    assert ui.client(basic=True, password=ui.password.upper()).get("/api/runs").status == 401
    assert ui.client(basic=True, user="root").get("/api/runs").status == 401

    listed = ui.client(basic=True).get("/api/runs")
    assert listed.status == 200 and listed.headers["Content-Type"] == "application/json"
    runs = {run["id"]: run for run in listed.json()["runs"]}
    assert set(runs) == {str(finished.id), scheduled_id}
    for run in runs.values():
        assert {"id", "name", "status", "claimed_by", "created_at", "completed_at"} <= set(run)
    new = runs[scheduled_id]
    assert (new["name"], new["status"], new["claimed_by"], new["completed_at"]) == (
        "tests.workflows.quick",
        "scheduled",
        None,
        None,
    )
    assert new["steps"] == {"total": 0, "done": 0, "failed": 0}
    done = runs[str(finished.id)]
    assert (done["status"], done["claimed_by"]) == ("completed", "tests")
    assert done["completed_at"] is not None and done["created_at"] is not None
    assert done["steps"] == {"total": 2, "done": 1, "failed": 1}


@ANY_BACKEND
def test_the_login_form_signs_in_with_its_csrf_token_and_a_wrong_password_is_refused(start_ui):
    """A real form POST with the token from the form and its cookie signs
    admin in; a wrong password gets the form again with 401."""
    ui = start_ui()
    browser = ui.client()
    _, token = browser.form("/login?next=/workers")

    wrong = browser.post(
        "/login",
        {"csrfmiddlewaretoken": token, "username": "admin", "password": "nope", "next": "/workers"},
    )
    assert wrong.status == 401 and "Wrong user name or password" in wrong.text
    assert browser.get("/").status == 302

    _, token = browser.form("/login?next=/workers")
    signed_in = browser.post(
        "/login",
        {
            "csrfmiddlewaretoken": token,
            "username": "admin",
            "password": ui.password,
            "next": "/workers",
        },
    )
    assert signed_in.status == 302 and signed_in.headers["Location"] == "/workers"
    home = browser.get("/")
    assert home.status == 200 and "Log out" in home.text
    assert browser.get("/api/runs").status == 200


@ANY_BACKEND
def test_a_login_post_without_the_csrf_token_is_refused(start_ui):
    """The login form's POST is CSRF-checked: without the token it is 403."""
    ui = start_ui()
    browser = ui.client()
    browser.form("/login")
    forged = browser.post("/login", {"username": "admin", "password": ui.password})
    assert forged.status == 403
    assert browser.get("/").status == 302


def test_the_ui_and_database_passwords_never_reach_the_log_even_at_debug(start_ui):
    """Failed logins, basic auth and a stream at DEBUG: the UI password, its
    secret key, a mistyped password and the database password stay out of
    the process's output."""
    db_password = "db-" + uuid.uuid4().hex
    secret_key = "key-" + uuid.uuid4().hex
    mistyped = "typo-" + uuid.uuid4().hex
    ui = start_ui(
        env=workflow_environment(
            url_with_password(db_password),
            EVERYSTEP_LOG_LEVEL="DEBUG",
            EVERYSTEP_UI_SECRET_KEY=secret_key,
        )
    )
    browser = ui.client()
    _, token = browser.form("/login")
    failed = browser.post(
        "/login", {"csrfmiddlewaretoken": token, "username": "admin", "password": mistyped}
    )
    assert failed.status == 401
    assert ui.client(basic=True, password=mistyped).get("/api/runs").status == 401
    assert ui.client(basic=True).get("/api/runs").status == 200
    _, token = browser.form("/login")
    signed_in = browser.post(
        "/login", {"csrfmiddlewaretoken": token, "username": "admin", "password": ui.password}
    )
    assert signed_in.status == 302 and browser.get("/workers").status == 200
    stream = ui.stream("view=runs")
    stream.next_event("change", 10)
    code, _ = stop(ui)
    stream.close()
    assert code == 0

    log = ui.process.log()
    assert "failed login to the operator UI" in log  # the failure was logged...
    leaked = [s for s in (ui.password, secret_key, mistyped, db_password) if s in log]
    assert not leaked, f"secrets in the log: {leaked}\n{log}"  # ...but no secret


@ANY_BACKEND
def test_the_assets_are_served_from_inside_the_zipapp(start_ui, tmp_path):
    """htmx, the UI's script and its stylesheet come from the zipapp itself,
    with nothing of the repository on its path, to anyone."""
    ui = start_ui(
        env=clean_environment(
            EVERYSTEP_DATABASE_URL=database_url(), EVERYSTEP_UI_PASSWORD="a-long-enough-password"
        )
    )
    for name, content_type in [
        ("htmx.min.js", "javascript"),
        ("ui.js", "javascript"),
        ("ui.css", "text/css"),
    ]:
        asset = ui.client().get(f"/assets/{name}")
        assert asset.status == 200, (name, asset.status)
        assert content_type in asset.headers["Content-Type"]
        assert asset.body == (STATIC / name).read_bytes()
    assert ui.client().get("/assets/nothing.js").status == 404


def test_the_stream_sends_a_change_at_once_and_a_new_run_within_two_seconds(start_ui):
    """``api/stream?view=runs`` sends the runs when opened, then a change
    naming a run scheduled later within 2 s of its commit."""
    ui = start_ui()
    stream = ui.stream("view=runs")
    try:
        first = json.loads(stream.next_event("change", 10))
        assert first["runs"] == []
        run = schedule(workflows.quick, 1)
        scheduled_at = time.monotonic()
        changed = json.loads(stream.next_event("change", LIVE_DEADLINE, containing=str(run.id)))
        took = time.monotonic() - scheduled_at
        assert [r["id"] for r in changed["runs"]] == [str(run.id)]
        print(f"the new run's change arrived {took:.2f}s after its commit")
    finally:
        stream.close()


@ANY_BACKEND
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_with_a_stream_open_ends_the_stream_and_exits_0(start_ui, sig):
    """SIGTERM or SIGINT ends the open stream and the UI exits 0 within the
    deadline, its last log line "operator UI stopped"."""
    ui = start_ui()
    stream = ui.stream("view=runs")
    try:
        stream.next_event("change", 10)
        code, took = stop(ui, sig)
        print(f"{sig.name}: exited {code} after {took:.2f}s")
        assert code == 0, ui.process.log()
        assert took < STOP_DEADLINE, f"{sig.name} took {took:.1f}s:\n{ui.process.log()}"
        assert b"event: change" not in stream.rest(timeout=5)  # ended, nothing more
    finally:
        stream.close()
    log = ui.process.log()
    assert log.strip().splitlines()[-1].endswith("operator UI stopped"), log
    assert "Traceback" not in log


def requeue_lost_worker(ui, name):
    """POST the requeue of `name`'s runs with basic auth and the CSRF token of
    the workers page (its log-out form); return (response, workers page)."""
    operator = ui.client(basic=True)
    page, token = operator.form("/workers")
    return operator.post("/workers/requeue", {"csrfmiddlewaretoken": token, "worker": name}), page


@ANY_BACKEND
def test_a_read_only_ui_refuses_a_requeue_with_403_and_changes_nothing(start_ui):
    """EVERYSTEP_UI_READ_ONLY=true: no requeue button, and a forged requeue
    POST with a valid CSRF token is 403 naming read-only; the run stays parked."""
    lost_worker("w-gone")
    parked = park(workflows.quick, 1, worker="w-gone")
    ui = start_ui(EVERYSTEP_UI_READ_ONLY="true")
    assert "(read-only)" in ui.process.log()  # its serving line says so

    refused, page = requeue_lost_worker(ui, "w-gone")
    assert 'action="/workers/requeue"' not in page and "read-only" in page
    assert refused.status == 403, refused.text
    assert "read-only" in refused.text and "CSRF" not in refused.text
    parked.refresh_from_db()
    assert (parked.status, parked.claimed_by) == ("running", "w-gone")


@ANY_BACKEND
def test_with_actions_enabled_the_same_requeue_puts_the_lost_workers_runs_back(start_ui):
    """The same POST on a UI that is not read-only requeues the parked run:
    the read-only refusal above is read-only's doing."""
    lost_worker("w-gone")
    parked = park(workflows.quick, 1, worker="w-gone")
    ui = start_ui(EVERYSTEP_UI_READ_ONLY="false")

    done, page = requeue_lost_worker(ui, "w-gone")
    assert 'action="/workers/requeue"' in page
    assert done.status == 303 and done.headers["Location"] == "/workers?notice=requeued"
    parked.refresh_from_db()
    assert (parked.status, parked.claimed_by) == ("scheduled", None)
    assert "run(s) of worker w-gone requeued by admin" in ui.process.log()
