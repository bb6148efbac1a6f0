"""The zipapp's configuration (§8): every variable honoured, flags over the
environment, bad values refused in one line, secrets never shown."""

import datetime
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import tempfile
import uuid

import pytest
from django.db import connection

from everystep.models import Workflow
from tests import workflows
from tests.helpers import database_url, url_with_password, wait_until
from tests.zipapp import clean_environment, one_line_error, run_pyz, workflow_environment

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def pyz_worker(pyz, spawn_process, tmp_path):
    def spawn(*args, env):
        return spawn_process("pyz", [str(pyz), "worker", *args], env=env, cwd=tmp_path)

    return spawn


def stop(worker):
    worker.send(signal.SIGTERM)
    assert worker.wait() == 0, worker.log()


def ready_line(worker):
    worker.wait_ready()
    return next(line for line in worker.log().splitlines() if "ready" in line)


def test_worker_settings_come_from_the_environment(pyz_worker):
    env = workflow_environment(
        EVERYSTEP_POOL="3", EVERYSTEP_POLL="0.5", EVERYSTEP_NAME="from-env", EVERYSTEP_DRAIN="7"
    )
    worker = pyz_worker(env=env)
    assert "worker from-env ready: pool 3, poll 0.5s, drain 7.0s" in ready_line(worker)
    stop(worker)


def test_flags_override_the_environment(pyz_worker):
    env = workflow_environment(EVERYSTEP_POOL="3", EVERYSTEP_NAME="from-env", EVERYSTEP_DRAIN="7")
    worker = pyz_worker(
        "--pool", "5", "--name", "from-flag", "--drain", "2", "--poll", "0.1", env=env
    )
    assert "worker from-flag ready: pool 5, poll 0.1s, drain 2.0s" in ready_line(worker)
    stop(worker)


@pytest.mark.parametrize(
    "variables, expected",
    [
        ({"DYNO": "worker.3"}, "worker.3"),
        ({"DYNO": "worker.3", "EVERYSTEP_NAME": "named"}, "named"),
        ({}, socket.gethostname()),
    ],
)
def test_the_default_name_is_everystep_name_then_dyno_then_the_hostname(
    pyz_worker, variables, expected
):
    worker = pyz_worker(env=workflow_environment(**variables))
    assert f"worker {expected} ready" in ready_line(worker)
    stop(worker)


def test_catchup_can_be_switched_off(pyz_worker):
    parked = Workflow.objects.create(
        name="tests.workflows.quick", args=[1], status="running", claimed_by="parker"
    )
    worker = pyz_worker(
        env=workflow_environment(EVERYSTEP_NAME="parker", EVERYSTEP_CATCHUP="false")
    )
    worker.wait_ready()
    fresh = Workflow.objects.create(name="tests.workflows.quick", args=[2])
    wait_until(lambda: Workflow.objects.get(id=fresh.id).status == "completed")
    assert Workflow.objects.get(id=parked.id).status == "running"
    stop(worker)


def test_json_logs_are_one_object_per_line_and_the_level_filters(pyz_worker):
    worker = pyz_worker(env=workflow_environment(EVERYSTEP_LOG_FORMAT="json"))
    worker.wait_ready()
    run = Workflow.objects.create(name="tests.workflows.quick", args=[1])
    wait_until(lambda: Workflow.objects.get(id=run.id).status == "completed")
    stop(worker)
    records = [json.loads(line) for line in worker.log().splitlines()]
    assert any(r["message"].startswith("worker") and "ready" in r["message"] for r in records)
    assert {"time", "level", "logger", "message"} <= set(records[0])
    assert any(r.get("action") == "run_completed" for r in records)
    for record in records:  # ISO 8601, in UTC, as log pipelines parse it
        moment = datetime.datetime.fromisoformat(record["time"])
        assert moment.utcoffset() == datetime.timedelta(0), record["time"]
        assert abs(datetime.datetime.now(datetime.UTC) - moment) < datetime.timedelta(minutes=5)


def test_text_logs_start_with_an_iso_8601_time_and_the_level(pyz_worker):
    worker = pyz_worker(env=workflow_environment())
    worker.wait_ready()
    stop(worker)
    for line in worker.log().splitlines():
        moment, level, _ = line.split(maxsplit=2)
        assert datetime.datetime.fromisoformat(moment).utcoffset() is not None, line
        assert level in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"), line

    quiet = pyz_worker(env=workflow_environment(EVERYSTEP_LOG_LEVEL="warning"))
    run = Workflow.objects.create(name="tests.workflows.quick", args=[2])
    wait_until(lambda: Workflow.objects.get(id=run.id).status == "completed")
    stop(quiet)
    assert quiet.log() == ""  # nothing at WARNING or above happened


def test_database_url_falls_back_to_database_url_then_sqlite(pyz, tmp_path):
    env = workflow_environment()
    env["DATABASE_URL"] = env.pop("EVERYSTEP_DATABASE_URL")
    result = run_pyz(pyz, "check", env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    default = run_pyz(pyz, "migrate", env=clean_environment(), cwd=tmp_path)
    assert default.returncode == 0, default.stderr
    assert (tmp_path / "everystep.sqlite3").exists()


def test_everystep_path_finds_the_workflow_modules(pyz, tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "flows.py").write_text(
        "from everystep import step, workflow\n@workflow\ndef hello():\n    return 1\n"
    )
    env = workflow_environment(EVERYSTEP_WORKFLOWS="flows", EVERYSTEP_PATH=str(tmp_path / "mine"))
    result = run_pyz(pyz, "check", env=env, cwd=tmp_path)
    assert "flows.hello" in result.stdout


@pytest.mark.parametrize(
    "variables, command, fragment",
    [
        ({"EVERYSTEP_POOL": "abc"}, "worker", "EVERYSTEP_POOL"),
        ({"EVERYSTEP_POLL": "-1"}, "worker", "EVERYSTEP_POLL"),
        ({"EVERYSTEP_POLL": "inf"}, "worker", "EVERYSTEP_POLL='inf' is not a finite number"),
        ({"EVERYSTEP_POLL": "nan"}, "worker", "EVERYSTEP_POLL='nan' is not a finite number"),
        ({"EVERYSTEP_POLL": "1e10"}, "worker", "EVERYSTEP_POLL='1e10' must be at most 3600"),
        ({"EVERYSTEP_DRAIN": "1e300"}, "worker", "EVERYSTEP_DRAIN='1e300' must be at most 86400"),
        ({"EVERYSTEP_DB_DEADLINE": "1e10"}, "worker", "EVERYSTEP_DB_DEADLINE"),
        ({"EVERYSTEP_WAIT_FOR_MIGRATIONS": "1e12"}, "worker", "must be at most 86400"),
        (
            {"EVERYSTEP_POOL": "100000000"},
            "worker",
            "EVERYSTEP_POOL='100000000' must be at most 1000",
        ),
        ({"EVERYSTEP_DRAIN": "inf"}, "worker", "EVERYSTEP_DRAIN='inf' is not a finite number"),
        ({"EVERYSTEP_DRAIN": "nan"}, "worker", "EVERYSTEP_DRAIN='nan' is not a finite number"),
        ({"EVERYSTEP_DRAIN": "soon"}, "worker", "EVERYSTEP_DRAIN"),
        ({"EVERYSTEP_CATCHUP": "perhaps"}, "worker", "EVERYSTEP_CATCHUP"),
        ({"EVERYSTEP_LOG_FORMAT": "xml"}, "worker", "EVERYSTEP_LOG_FORMAT"),
        ({"EVERYSTEP_DATABASE_URL": "redis://127.0.0.1/0"}, "worker", "EVERYSTEP_DATABASE_URL"),
        (
            {"EVERYSTEP_DATABASE_URL": "postgres://127.0.0.1/x?prepare_threshold=soon"},
            "worker",
            "prepare_threshold",
        ),
        ({"EVERYSTEP_DATABASE_URL": "postgres://"}, "check", "names no database"),
        (
            {"EVERYSTEP_SESSION_URL": "redis://127.0.0.1/0"},
            "worker",
            "EVERYSTEP_SESSION_URL: unsupported scheme redis://",
        ),
        (
            {"EVERYSTEP_SESSION_URL": "sqlite:////tmp/other.sqlite3"},
            "worker",
            "EVERYSTEP_SESSION_URL: must be a PostgreSQL or MariaDB/MySQL URL of the same",
        ),
        (
            {"EVERYSTEP_DATABASE_URL": "sqlite:///no/such/dir/db.sqlite3"},
            "check",
            "/no/such/dir for the SQLite file does not exist",
        ),
        (
            {"EVERYSTEP_DATABASE_URL": "postgres://u@127.0.0.1/db?sslmode=bogus"},
            "check",
            "disable, allow, prefer, require, verify-ca, verify-full",
        ),
        (
            {"EVERYSTEP_DATABASE_URL": "postgres://u@127.0.0.1/db?sslmode=require&colour=blue"},
            "check",
            "unknown PostgreSQL connection option 'colour'",
        ),
        ({"EVERYSTEP_WORKFLOWS": ""}, "worker", "EVERYSTEP_WORKFLOWS"),
        ({"EVERYSTEP_WORKFLOWS": ""}, "schedule", "EVERYSTEP_WORKFLOWS"),
        ({"EVERYSTEP_WORKFLOWS": "no_such_module"}, "worker", "no_such_module"),
        ({"EVERYSTEP_WORKFLOWS": "tests.broken_workflows"}, "worker", "tests.broken_workflows"),
        ({"SENTRY_DSN": "not a dsn"}, "worker", "SENTRY_DSN"),
        (
            {"EVERYSTEP_WAIT_FOR_MIGRATIONS": "a while"},
            "worker",
            "EVERYSTEP_WAIT_FOR_MIGRATIONS='a while'",
        ),
        ({"EVERYSTEP_WAIT_FOR_MIGRATIONS": "-5"}, "worker", "EVERYSTEP_WAIT_FOR_MIGRATIONS"),
    ],
)
def test_bad_configuration_exits_2_with_one_line_naming_it(
    pyz, tmp_path, variables, command, fragment
):
    args = [command, "quick"] if command == "schedule" else [command]
    result = run_pyz(pyz, *args, env=workflow_environment(**variables), cwd=tmp_path, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    line = one_line_error(result)
    assert fragment in line
    if "EVERYSTEP_DATABASE_URL" in variables:
        assert line.startswith("everystep: error: EVERYSTEP_DATABASE_URL: ")


def test_bad_flags_exit_2_with_one_line(pyz, tmp_path):
    for args in (
        ["worker", "--pool", "many"],
        ["worker", "--pool", "0"],
        ["worker", "--drain", "-1"],
        ["worker", "--poll", "inf"],
        ["worker", "--poll", "nan"],
        ["worker", "--drain", "inf"],
        ["worker", "--drain", "nan"],
    ):
        result = run_pyz(pyz, *args, env=workflow_environment(), cwd=tmp_path, timeout=60)
        assert result.returncode == 2, (args, result.stderr)
        line = one_line_error(result)
        if args[-1] in ("inf", "nan"):
            assert "not a finite number" in line


def test_passwords_and_sentry_dsns_never_reach_check_output_or_worker_logs(
    pyz, pyz_worker, tmp_path
):
    password, sentry_key = "pa55-" + uuid.uuid4().hex, "k3y" + uuid.uuid4().hex
    dsn = f"http://{sentry_key}@127.0.0.1:9/42"
    bad_url = f"postgres://someone:{password}@127.0.0.1:9/nowhere"
    session_url = f"postgres://direct:{password}@127.0.0.1:9/nowhere"
    env = workflow_environment(bad_url, SENTRY_DSN=dsn, EVERYSTEP_SESSION_URL=session_url)
    check = run_pyz(pyz, "check", env=env, cwd=tmp_path)
    assert check.returncode != 0
    assert "someone:***@127.0.0.1" in check.stdout and "direct:***@127.0.0.1" in check.stdout
    assert (
        password not in check.stdout + check.stderr
        and sentry_key not in check.stdout + check.stderr
    )

    url = url_with_password(password)
    worker = pyz_worker(env=workflow_environment(url, SENTRY_DSN=dsn, EVERYSTEP_LOG_LEVEL="DEBUG"))
    worker.wait_ready()
    run = Workflow.objects.create(name="tests.workflows.failing_body")
    wait_until(lambda: Workflow.objects.get(id=run.id).status == "failed")
    stop(worker)
    assert password not in worker.log() and sentry_key not in worker.log()


def test_passwords_in_the_query_string_and_in_manage_output_are_masked(pyz, tmp_path):
    password, query_password = "pa55-" + uuid.uuid4().hex, "qu3ry-" + uuid.uuid4().hex
    short, sentry_key = "Zq9", "k3y" + uuid.uuid4().hex  # a short secret is masked too
    secrets = (password, query_password, short, sentry_key)
    url = (
        f"postgres://someone:{password}@127.0.0.1:9/nowhere"
        f"?password={query_password}&sslpassword={short}"
    )
    env = workflow_environment(url, SENTRY_DSN=f"http://{sentry_key}@127.0.0.1:9/42")

    def shown(*args, variables=env):
        result = run_pyz(pyz, *args, env=variables, cwd=tmp_path)
        output = result.stdout + result.stderr
        assert not [secret for secret in secrets if secret in output], output
        return result

    check = shown("check")
    assert check.returncode == 1  # nothing listens on port 9
    assert "someone:***@127.0.0.1:9/nowhere?password=***&sslpassword=***" in check.stdout

    diffsettings = shown("manage", "diffsettings")
    assert diffsettings.returncode == 0, diffsettings.stderr
    assert "'PASSWORD': '***'" in diffsettings.stdout
    assert "'password': '***'" in diffsettings.stdout

    script = (
        "import os, sys; from django.conf import settings; "
        "print(settings.DATABASES['default']); print(os.environ['SENTRY_DSN'], file=sys.stderr)"
    )
    shell = shown("manage", "shell", "-c", script)
    assert shell.returncode == 0, shell.stderr
    assert "http://***@127.0.0.1:9/42" in shell.stderr

    bad_url = {**env, "EVERYSTEP_DATABASE_URL": url + "&sslmode=bogus"}
    refused = shown("check", variables=bad_url)
    assert refused.returncode == 2 and "sslmode" in one_line_error(refused)


def test_the_worker_refuses_an_unmigrated_server_database_and_sqlite_migrates_itself(
    pyz, pyz_worker, tmp_path, empty_database_url
):
    env = workflow_environment(empty_database_url)
    if connection.vendor == "sqlite":
        worker = pyz_worker(env=env)
        worker.wait_ready()
        scheduled = run_pyz(pyz, "schedule", "quick", "1", env=env, cwd=tmp_path)
        assert scheduled.returncode == 0, scheduled.stderr
        stop(worker)
        return
    result = run_pyz(pyz, "worker", env=env, cwd=tmp_path)
    assert result.returncode == 2
    assert "run `everystep migrate`" in one_line_error(result)
    check = run_pyz(pyz, "check", env=env, cwd=tmp_path)
    assert check.returncode == 1 and "run migrate" in check.stdout
    first = run_pyz(pyz, "migrate", env=env, cwd=tmp_path)
    second = run_pyz(pyz, "migrate", env=env, cwd=tmp_path)
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert "No migrations to apply" in second.stdout
    assert run_pyz(pyz, "check", env=env, cwd=tmp_path).returncode == 0


def test_a_worker_needs_only_everysteps_tables_and_check_still_covers_the_uis(
    pyz, pyz_worker, tmp_path, empty_database_url
):
    """A worker signs no one in: it starts, and runs, on a database migrated
    for everystep alone. `check` still counts the UI's sessions table."""
    env = workflow_environment(empty_database_url)
    migrated = run_pyz(pyz, "manage", "migrate", "everystep", env=env, cwd=tmp_path)
    assert migrated.returncode == 0, migrated.stderr
    worker = pyz_worker(env=env)
    worker.wait_ready()
    scheduled = run_pyz(pyz, "schedule", "quick", "1", env=env, cwd=tmp_path)
    assert scheduled.returncode == 0, scheduled.stderr
    run_id = scheduled.stdout.strip()

    def status():
        shown = run_pyz(pyz, "show", run_id, "--json", env=env, cwd=tmp_path)
        return json.loads(shown.stdout)["status"]

    wait_until(lambda: status() == "completed", timeout=60, interval=0.2)
    stop(worker)
    check = run_pyz(pyz, "check", env=env, cwd=tmp_path)
    assert check.returncode == 1 and "1 migration(s) pending: run migrate" in check.stdout
    assert run_pyz(pyz, "migrate", env=env, cwd=tmp_path).returncode == 0
    assert run_pyz(pyz, "check", env=env, cwd=tmp_path).returncode == 0


def test_a_started_zipapp_reads_its_packages_and_their_metadata_outside_its_archive(pyz, tmp_path):
    """Once shiv has extracted them, the bundled packages and their metadata
    are found where they were extracted; the archive is off the import path,
    where every metadata lookup would read its whole directory again."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "flows.py").write_text(
        "import importlib.metadata, os, sys\n"
        "import django\n"
        "archive = os.path.realpath(sys.argv[0])\n"
        "print('archive on the path:', archive in map(os.path.realpath, sys.path))\n"
        "print('django', importlib.metadata.version('django'), django.__version__)\n"
        "print('from', django.__file__)\n"
        "from everystep import workflow\n"
        "@workflow\n"
        "def hello():\n"
        "    return 1\n"
    )
    env = workflow_environment(EVERYSTEP_WORKFLOWS="flows", EVERYSTEP_PATH=str(tmp_path / "mine"))
    env["SHIV_ROOT"] = str(tmp_path / "shiv")
    result = run_pyz(pyz, "check", env=env, cwd=tmp_path)
    assert "flows.hello" in result.stdout, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert "archive on the path: False" in lines
    [versions] = [line.split() for line in lines if line.startswith("django ")]
    assert versions[1] == versions[2]
    [origin] = [line for line in lines if line.startswith("from ")]
    assert origin.startswith(f"from {tmp_path / 'shiv'}/") and "site-packages/django" in origin


def test_a_zipapp_worker_runs_its_workflows_with_the_collector_on_and_its_start_frozen(
    pyz, pyz_worker, tmp_path
):
    """The collector is held off while the process loads its code, then
    turned back on: the steps of a run find it on, and what the start loaded
    out of its reach (frozen)."""
    env = workflow_environment()
    worker = pyz_worker(env=env)
    worker.wait_ready()
    scheduled = run_pyz(pyz, "schedule", "collector_state", env=env, cwd=tmp_path)
    assert scheduled.returncode == 0, scheduled.stderr
    run_id = scheduled.stdout.strip()
    wait_until(lambda: Workflow.objects.get(id=run_id).status == "completed", timeout=60)
    stop(worker)
    result = Workflow.objects.get(id=run_id).result
    assert result["enabled"] is True
    assert result["frozen"] > workflows.FROZEN_AT_THE_START, result


# Counts the archives `zipfile` opens while the zipapp named by argv[1] runs.
OPENED_WITH_ZIPFILE = """
import runpy, sys, zipfile
opened = []
open_archive = zipfile.ZipFile.__init__
def counted(self, file, *args, **kwargs):
    opened.append(str(file))
    open_archive(self, file, *args, **kwargs)
zipfile.ZipFile.__init__ = counted
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    print("opened with zipfile:", opened, file=sys.stderr)
"""


def test_the_zipapp_opens_its_archive_only_to_extract_it(pyz, tmp_path):
    """Python reads the archive's directory to start it; once its packages
    are extracted, no start reads that directory again."""
    env = clean_environment(SHIV_ROOT=str(tmp_path / "shiv"))

    def start():
        result = subprocess.run(
            ["python3", "-c", OPENED_WITH_ZIPFILE, str(pyz), "--version"],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0 and result.stdout.startswith("everystep "), result.stderr
        return result.stderr.strip().splitlines()[-1]

    assert start() == f"opened with zipfile: {[str(pyz)]}"  # the first: extracted
    assert list((tmp_path / "shiv").glob("*/site-packages/django"))
    assert start() == "opened with zipfile: []"
    assert start() == "opened with zipfile: []"


@pytest.fixture
def empty_database_url(tmp_path):
    """A URL of a new, empty database on the test server (or a new SQLite file)."""
    if connection.vendor == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.sqlite3'}"
        return
    name = f"everystep_empty_{uuid.uuid4().hex[:8]}"
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE DATABASE {name}")
    yield database_url().rsplit("/", 1)[0] + f"/{name}"
    connection.close()
    from django.db import connections

    with connections["default"].cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"DROP DATABASE {name} WITH (FORCE)")
        else:
            cursor.execute(f"DROP DATABASE {name}")


def test_the_zipapp_refuses_another_python_in_one_line(pyz, tmp_path):
    import glob

    others = [
        p for p in glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[23]*/bin/python3.1[23]"))
    ]
    assert others, "a Python other than the build's is needed for this test (3.12 or 3.13)"
    result = subprocess.run(
        [others[0], str(pyz), "check"], capture_output=True, text=True, cwd=tmp_path
    )
    assert result.returncode == 2
    line = one_line_error(result)
    assert "was built for Python 3.11" in line and "make pyz PYTHON=" in line


def test_notify_can_be_switched_off(pyz_worker):
    worker = pyz_worker(env=workflow_environment(EVERYSTEP_NOTIFY="false"))
    assert ready_line(worker).endswith("polling")
    stop(worker)


def test_installed_apps_extend_the_bundled_settings(pyz, tmp_path):
    env = workflow_environment(EVERYSTEP_INSTALLED_APPS="django.contrib.contenttypes")
    result = run_pyz(pyz, "manage", "showmigrations", "contenttypes", env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "0001_initial" in result.stdout


def test_django_settings_module_replaces_the_bundled_settings(pyz, tmp_path):
    env = workflow_environment(
        DJANGO_SETTINGS_MODULE="tests.settings", EVERYSTEP_WORKFLOWS="tests.workflows"
    )
    env["EVERYSTEP_TEST_DB"] = os.environ.get("EVERYSTEP_TEST_DB", "sqlite")
    env["PYTHONPATH"] = env["EVERYSTEP_PATH"]
    result = run_pyz(pyz, "check", env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "tests.workflows.quick" in result.stdout


def test_a_sqlite_directory_this_user_cannot_write_exits_2_naming_it(pyz, tmp_path):
    """A read-only root without the data volume: the error names the
    directory and the user, not SQLite's "unable to open database file"."""
    nobody = 65534
    top = pathlib.Path(tempfile.mkdtemp(prefix="everystep-readonly-"))  # 0700: open it
    top.chmod(0o755)
    data = top / "data"
    data.mkdir(mode=0o755)  # root's: nobody cannot write into it
    scratch = top / "scratch"
    scratch.mkdir()
    os.chown(scratch, nobody, nobody)
    env = workflow_environment(
        EVERYSTEP_DATABASE_URL=f"sqlite:///{data}/everystep.sqlite3", SHIV_ROOT=str(scratch)
    )
    try:
        result = subprocess.run(
            [str(pyz), "worker"],
            env=env,
            cwd=scratch,
            capture_output=True,
            text=True,
            timeout=60,
            user=nobody,
            group=nobody,
            extra_groups=[],
        )
    finally:
        shutil.rmtree(top, ignore_errors=True)
    assert result.returncode == 2, result.stderr
    line = one_line_error(result)
    assert f"the directory {data} for the SQLite file is not writable" in line
    assert f"uid {nobody}" in line
