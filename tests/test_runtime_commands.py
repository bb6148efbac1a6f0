"""The zipapp's commands (§8), run from outside the repository against the
test database: schedule, runs, show, requeue, resolve-step, migrate, check,
manage, worker."""

import datetime
import json
import os
import signal
import uuid

import pytest

from everystep.models import Step, Workflow
from tests.helpers import opened, started, wait_until
from tests.zipapp import one_line_error, run_pyz, workflow_environment

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def everystep(pyz, tmp_path):
    """``everystep(*args, input=None, **env)``: run the zipapp in a scratch
    directory, with `input` on its standard input."""

    def run(*args, env=None, input=None, **variables):
        return run_pyz(
            pyz, *args, env=env or workflow_environment(**variables), cwd=tmp_path, input=input
        )

    return run


@pytest.fixture
def pyz_worker(pyz, spawn_process, tmp_path):
    """Start ``everystep.pyz worker`` processes: ``pyz_worker("name", *flags, **env)``."""

    def spawn(name, *args, env=None, **variables):
        command = [str(pyz), "worker", "--name", name, *args]
        return spawn_process(
            name, command, env=env or workflow_environment(**variables), cwd=tmp_path
        )

    return spawn


def test_schedule_prints_the_run_id_and_a_worker_completes_it(everystep, pyz_worker):
    result = everystep("schedule", "tests.workflows.add_twice", "1", "2")
    assert result.returncode == 0, result.stderr
    run_id = uuid.UUID(result.stdout.strip())
    bare = everystep("schedule", "quick", "5", "--idempotency-key", "k1")
    again = everystep("schedule", "quick", "6", "--idempotency-key", "k1")
    assert bare.stdout == again.stdout

    worker = pyz_worker("cli-worker").wait_ready()
    wait_until(lambda: Workflow.objects.filter(status="completed").count() == 2)
    assert Workflow.objects.get(id=run_id).result == 5
    worker.send(signal.SIGTERM)
    assert worker.wait() == 0


def test_runs_and_show_print_json_with_the_recorded_steps(everystep, pyz_worker):
    run_id = everystep("schedule", "add_twice", "1", "2").stdout.strip()
    worker = pyz_worker("json-worker").wait_ready()
    wait_until(lambda: Workflow.objects.get(id=run_id).status == "completed")
    worker.send(signal.SIGTERM)
    assert worker.wait() == 0

    listed = json.loads(everystep("runs", "--json").stdout)
    assert [r["id"] for r in listed] == [run_id]
    assert {"id", "name", "status", "claimed_by", "created_at", "completed_at"} <= set(listed[0])
    assert listed[0]["status"] == "completed" and listed[0]["claimed_by"] == "json-worker"
    assert json.loads(everystep("runs", "--json", "--status", "failed").stdout) == []

    shown = json.loads(everystep("show", run_id, "--json").stdout)
    assert shown["result"] == 5 and shown["args"] == [1, 2]
    assert [
        (s["step_id"], s["name"], s["status"], s["args"], s["kwargs"], s["result"], s["error"])
        for s in shown["steps"]
    ] == [
        ("1", "tests.workflows.add", "done", [1, 2], {}, 3, None),
        ("2", "tests.workflows.add", "done", [3, 2], {}, 5, None),
    ]
    text = everystep("show", run_id).stdout
    assert "completed" in text and "tests.workflows.add" in text
    assert run_id in everystep("runs").stdout


def test_requeue_claimed_by_recovers_the_runs_of_a_sigkilled_worker(
    everystep, pyz_worker, tmp_path
):
    gates = tmp_path / "gates"
    gates.mkdir()
    run_id = everystep("schedule", "gated", json.dumps(str(gates))).stdout.strip()
    doomed = pyz_worker("doomed").wait_ready()
    started(gates, "first")

    refused = everystep("requeue", "--claimed-by", "doomed")
    assert refused.returncode == 2 and "alive" in one_line_error(refused)
    doomed.send(signal.SIGKILL)
    doomed.wait()

    result = everystep("requeue", "--claimed-by", "doomed")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [run_id]
    run = Workflow.objects.get(id=run_id)
    assert (run.status, run.claimed_by) == ("scheduled", None)

    opened(gates, "first")
    opened(gates, "second")
    rescuer = pyz_worker("rescuer").wait_ready()
    wait_until(lambda: Workflow.objects.get(id=run_id).status == "completed")
    rescuer.send(signal.SIGTERM)
    assert rescuer.wait() == 0


def test_requeue_by_run_id_and_its_usage_errors(everystep):
    run = Workflow.objects.create(
        name="tests.workflows.quick", args=[1], status="running", claimed_by="gone"
    )
    assert everystep("requeue", str(run.id)).stdout.split() == [str(run.id)]
    assert Workflow.objects.get(id=run.id).status == "scheduled"
    for args in (
        ["requeue"],
        ["requeue", "not-a-uuid"],
        ["requeue", str(run.id), "--claimed-by", "x"],
    ):
        result = everystep(*args)
        assert result.returncode == 2
        one_line_error(result)


def test_requeue_refuses_a_run_that_is_not_running_naming_its_status_and_changes_nothing(
    everystep,
):
    failed = Workflow.objects.create(name="tests.workflows.quick", args=[1], status="failed")
    parked = Workflow.objects.create(
        name="tests.workflows.quick", args=[2], status="running", claimed_by="gone"
    )
    missing = uuid.uuid4()
    result = everystep("requeue", str(parked.id), str(failed.id), str(missing))
    assert result.returncode == 2 and result.stdout == ""
    error = one_line_error(result)
    assert f"run {failed.id} failed: run it again with everystep retry" in error
    assert f"no run {missing}" in error  # the standalone command, not manage.py's
    assert Workflow.objects.get(id=parked.id).status == "running"  # all or nothing


def test_runs_filters_as_the_ui_does_and_its_json_is_the_apis(everystep):
    from everystep.core.serde import readable_json
    from everystep.ui import snapshots

    quick = Workflow.objects.create(name="tests.workflows.quick", args=[1], status="completed")
    pay = Workflow.objects.create(name="tests.workflows.pay", args=[2], status="failed")
    Step.objects.create(workflow=pay, step_id="1", name="tests.workflows.charge", status="done")
    cancelled = Workflow.objects.create(name="tests.workflows.pay", args=[3], status="cancelled")

    def listed(*args):
        result = everystep("runs", "--json", *args)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    everything = listed()
    api = json.loads(readable_json(snapshots.public(snapshots.runs({}))))["runs"]
    assert everything == api  # one shape, the same runs, newest first
    assert [r["id"] for r in everything] == [str(cancelled.id), str(pay.id), str(quick.id)]
    assert everything[1]["steps"] == {"total": 1, "done": 1, "failed": 0}
    by_workflow = listed("--workflow", "tests.workflows.pay")
    assert [r["id"] for r in by_workflow] == [str(cancelled.id), str(pay.id)]
    assert listed("--workflow", "pay") == by_workflow  # the short name schedule takes
    assert [r["id"] for r in listed("--status", "cancelled")] == [str(cancelled.id)]
    assert len(listed("--since", "1h")) == 3
    tomorrow = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=1)).isoformat()
    assert listed("--since", tomorrow) == []
    today = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d")  # a date, not seconds
    assert len(listed("--since", today)) == 3
    for bad in (["--since", "yesterday"], ["--status", "done"], ["--workflow", "nosuch"]):
        result = everystep("runs", *bad)
        assert result.returncode == 2
        assert bad[1] in one_line_error(result)


def test_resolve_step_resolves_a_blocked_run(everystep):
    run = Workflow.objects.create(
        name="tests.workflows.pay",
        args=[3],
        status="blocked",
        error={"type": "x", "message": "m", "args": []},
    )
    Step.objects.create(workflow=run, step_id="1", name="tests.workflows.charge", status="started")

    refused = everystep("resolve-step", str(run.id), "2", "--discard")
    assert refused.returncode == 2 and "not recorded" in one_line_error(refused)
    result = everystep("resolve-step", str(run.id), "1", "--result", '{"charged": 3}')
    assert result.returncode == 0, result.stderr
    run.refresh_from_db()
    assert run.status == "scheduled"
    assert run.steps.get().result == {"charged": 3}
    again = everystep("resolve-step", str(run.id), "1", "--discard")
    assert again.returncode == 2 and "not blocked" in one_line_error(again)


def test_a_blocked_run_names_the_standalone_command_that_resolves_it(everystep, pyz_worker):
    """A worker killed during an unsafe step left it started; the zipapp's
    worker that takes the run back blocks it, naming `everystep
    resolve-step` (a standalone user has no manage.py)."""
    from tests import workflows
    from tests.helpers import park

    run = park(workflows.pay, 3, worker="killed")
    Step.objects.create(workflow=run, step_id="1", name="tests.workflows.charge", status="started")
    worker = pyz_worker("killed").wait_ready()
    wait_until(lambda: Workflow.objects.get(id=run.id).status == "blocked")
    message = Workflow.objects.get(id=run.id).error["message"]
    assert f"resolve it with everystep resolve-step {run.id} 1 " in message
    assert "manage.py" not in message
    worker.send(signal.SIGTERM)
    assert worker.wait() == 0


def test_manage_passes_through_to_django(everystep):
    result = everystep("manage", "showmigrations", "everystep")
    assert result.returncode == 0, result.stderr
    assert "[X] 0001_initial" in result.stdout


def test_schedule_usage_errors_are_one_line_and_exit_2(everystep):
    for args, fragment in [
        (["schedule", "no_such_workflow"], "no workflow named"),
        (["schedule", "quick", "{not json"], "argument 1 is not valid JSON"),
        (["schedule", "quick", '{"a": [1, 2]}', "--idempotency-key", "x" * 300], "idempotency_key"),
        (["bogus-command"], "invalid choice"),
        (["show", "nope"], "not a run id"),
    ]:
        result = everystep(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert fragment in one_line_error(result)
    assert not Workflow.objects.exists()


def test_schedule_at_a_time_or_in_a_while(everystep):
    later = everystep("schedule", "quick", "1", "--in", "1h30m")
    at = everystep("schedule", "quick", "2", "--at", "2030-01-01T12:00+01:00")
    assert later.returncode == 0 and at.returncode == 0, (later.stderr, at.stderr)
    delayed = Workflow.objects.get(id=later.stdout.strip())
    assert (delayed.run_at - delayed.created_at).total_seconds() == pytest.approx(5400, abs=1)
    expected = datetime.datetime(2030, 1, 1, 11, tzinfo=datetime.UTC)
    assert Workflow.objects.get(id=at.stdout.strip()).run_at == expected


def test_schedule_refuses_a_bad_time_in_one_line_with_exit_2(everystep):
    for args, fragment in [
        (["--at", "2030-01-01T12:00"], "must be an aware datetime"),
        (["--at", "tomorrow"], "is not a time: use ISO 8601"),
        (["--in=-5s"], "is not a duration"),
        (["--in", "5 weeks"], "is not a duration"),
        (["--in", "-5"], "must not be negative"),
        (["--in", "5s", "--at", "2030-01-01T12:00Z"], "not allowed with argument"),
    ]:
        result = everystep("schedule", "quick", "1", *args)
        assert result.returncode == 2, (args, result.stderr)
        assert fragment in one_line_error(result), (args, result.stderr)
    assert not Workflow.objects.exists()


def test_cancel_and_retry_from_the_command_line(everystep):
    run_id = everystep("schedule", "quick", "1").stdout.strip()
    cancelled = everystep("cancel", run_id, "--reason", "not needed")
    assert cancelled.returncode == 0, cancelled.stderr
    assert f"run {run_id} cancelled" in cancelled.stdout
    run = Workflow.objects.get(id=run_id)
    assert (run.status, run.error["message"]) == ("cancelled", "not needed")

    again = everystep("cancel", run_id)
    assert again.returncode == 2 and "is cancelled" in one_line_error(again)
    refused = everystep("retry", run_id)
    assert refused.returncode == 2 and "not failed" in one_line_error(refused)

    Workflow.objects.filter(id=run_id).update(status="failed")
    retried = everystep("retry", run_id)
    assert retried.returncode == 0, retried.stderr
    assert Workflow.objects.get(id=run_id).status == "scheduled"
    assert everystep("cancel", "nope").returncode == 2


def test_runs_limit_is_from_1_to_10000(everystep):
    for limit in ("0", "-1", "10001", "1000000000000000000000000000000"):
        result = everystep("runs", "--limit", limit)
        assert result.returncode == 2, (limit, result.stderr)
        assert "from 1 to 10000" in one_line_error(result)
    assert everystep("runs", "--limit", "10000").returncode == 0


def test_schedule_refuses_json_nested_too_deeply_or_holding_a_nul(everystep):
    # 100 KB: about the most one command-line argument can carry (128 KiB).
    deepest = "[" * 50_000 + "]" * 50_000
    for argument, fragment in [
        (deepest, "argument 1 is nested too deeply"),
        ("[" * 200 + "]" * 200, "nested deeper"),
        ('"a\\u0000b"', "NUL"),
    ]:
        result = everystep("schedule", "quick", argument)
        assert result.returncode == 2, (argument[:20], result.stderr[-500:])
        assert fragment in one_line_error(result)
    assert not Workflow.objects.exists()


def test_arguments_that_are_not_utf8_exit_2(everystep):
    not_utf8 = os.fsdecode(b"caf\xe9")  # as Python decodes such a byte string from argv
    for args, fragment in [
        (["schedule", "quick", not_utf8], "argument 3 is not valid UTF-8"),
        (["schedule", "quick", "1", "--idempotency-key", not_utf8], "argument 5 is not"),
        (["show", not_utf8], "argument 2 is not valid UTF-8"),
    ]:
        result = everystep(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert fragment in one_line_error(result)
    assert not Workflow.objects.exists()


def test_schedule_reads_large_arguments_from_standard_input_or_a_file(everystep, tmp_path):
    # 1 MiB: far over what a command line can carry.
    from_stdin, from_file = "i" * (1 << 20), "f" * (1 << 20)
    (tmp_path / "big.json").write_text(json.dumps(from_file))

    piped = everystep("schedule", "echo_values", "1", "-", input=json.dumps(from_stdin))
    assert piped.returncode == 0, piped.stderr
    assert Workflow.objects.get(id=piped.stdout.strip()).args == [1, from_stdin]
    read = everystep("schedule", "echo_values", f"@{tmp_path / 'big.json'}", "2")
    assert read.returncode == 0, read.stderr
    assert Workflow.objects.get(id=read.stdout.strip()).args == [from_file, 2]

    (tmp_path / "bad.json").write_text("{" + "x" * (1 << 20))
    (tmp_path / "latin1.json").write_bytes(b'"caf\xe9"')
    for args, fragment in [
        ([f"@{tmp_path / 'latin1.json'}"], "latin1.json' is not valid UTF-8"),
        (["@/dev/zero"], "'/dev/zero' holds more than 8 MiB"),
        (["-", "-"], "only one JSON_ARG can be -"),
        ([f"@{tmp_path / 'missing.json'}"], f"cannot read '{tmp_path / 'missing.json'}'"),
        ([f"@{tmp_path}"], "Is a directory"),
        (["1", f"@{tmp_path / 'bad.json'}"], "argument 2 is not valid JSON"),
    ]:
        result = everystep("schedule", "echo_values", *args, input="[]")
        assert result.returncode == 2, (args, result.stderr[-500:])
        line = one_line_error(result)
        assert fragment in line and len(line) < 300, line
    assert Workflow.objects.count() == 2

    usage = everystep("schedule", "--help").stdout
    assert "standard input" in usage and "@PATH" in usage


def test_check_lists_the_runs_that_wait_for_a_workflow_no_live_worker_has(everystep, pyz_worker):
    from everystep.models import Worker

    newer = Workflow.objects.create(name="newer.module.workflow", args=[1])
    worker = pyz_worker("older").wait_ready()
    wait_until(lambda: Worker.objects.filter(name="older", state="ready").exists())
    known = Workflow.objects.create(name="tests.workflows.quick", args=[1])
    wait_until(lambda: Workflow.objects.get(id=known.id).status == "completed")

    result = everystep("check")
    assert result.returncode == 0, result.stdout + result.stderr
    waiting = [line for line in result.stdout.splitlines() if line.startswith("waiting:")]
    assert waiting == [
        "waiting:    1 scheduled run(s) of newer.module.workflow: no live worker has this workflow"
    ]
    assert Workflow.objects.get(id=newer.id).status == "scheduled"
    worker.send(signal.SIGTERM)
    assert worker.wait() == 0


@pytest.mark.backends("sqlite")
def test_a_worker_and_the_ui_started_together_on_a_new_sqlite_file_both_start(
    pyz, spawn_process, tmp_path
):
    """As Compose starts a worker and the UI on one data volume: each
    migrates the new file on the spot, one after the other."""
    from tests.servers import free_port

    for attempt in range(3):
        data = tmp_path / f"data-{attempt}"
        data.mkdir()
        port = free_port()
        env = workflow_environment(
            url=f"sqlite:///{data}/everystep.sqlite3",
            EVERYSTEP_UI_PASSWORD="together-at-last",
            EVERYSTEP_NAME=f"together-{attempt}",
        )
        worker = spawn_process("worker", [str(pyz), "worker"], env=env, cwd=tmp_path)
        ui = spawn_process(
            "ui",
            [str(pyz), "ui", "--bind", "127.0.0.1", "--port", str(port)],
            env=env,
            cwd=tmp_path,
        )
        worker.wait_ready()
        ui.wait_for_log(f"operator UI serving on http://127.0.0.1:{port}/")
        for process in (worker, ui):
            process.send(signal.SIGTERM)
            assert process.wait() == 0, process.log()
