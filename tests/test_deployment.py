"""The deployment forms: the container image (hadolint, and the zipapp
unpacked and run the way the image runs it; tests/test_container.py builds
and runs the image itself), the Procfile, and `make run`."""

import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest

from everystep.models import Workflow
from tests.helpers import database_url, wait_until
from tests.servers import free_port
from tests.workerproc import REPO
from tests.zipapp import clean_environment

UNPRIVILEGED = 65534  # nobody
IMAGE_USER = 10001  # the Dockerfile's USER, owner of /app/data


def test_the_dockerfile_passes_hadolint():
    hadolint = pathlib.Path(sys.executable).parent / "hadolint"
    result = subprocess.run(
        [str(hadolint), str(REPO / "Dockerfile")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def final_stage(dockerfile):
    """ENV, WORKDIR, USER, STOPSIGNAL, ENTRYPOINT, CMD and the HEALTHCHECK's
    command of the last stage."""
    text = re.sub(r"\\\n\s*", " ", dockerfile.read_text())
    stage = text.rsplit("\nFROM ", 1)[1]
    found = {"ENV": {}}
    for line in stage.splitlines():
        instruction, _, rest = line.strip().partition(" ")
        if instruction == "ENV":
            found["ENV"].update(dict(pair.split("=", 1) for pair in rest.split()))
        elif instruction in ("WORKDIR", "USER", "STOPSIGNAL"):
            found[instruction] = rest.strip()
        elif instruction in ("ENTRYPOINT", "CMD"):
            found[instruction] = json.loads(rest)
        elif instruction == "HEALTHCHECK":
            found[instruction] = json.loads(rest.split(" CMD ", 1)[1])
    return found


@pytest.fixture
def image_root(pyz):
    """A directory laid out like the image's filesystem: the zipapp unpacked
    into /opt/everystep at build time by root, all read-only but /app/data
    (the image user's, writable by group 0); the example workflows in
    /app/workflows."""
    root = pathlib.Path(tempfile.mkdtemp(prefix="everystep-image-"))
    root.chmod(0o755)
    image = final_stage(REPO / "Dockerfile")
    # The build stage: `scripts/unpack-pyz /tmp/everystep.pyz /opt/everystep`.
    subprocess.run(
        [str(REPO / "scripts" / "unpack-pyz"), str(pyz), str(root / "opt" / "everystep")],
        check=True,
        capture_output=True,
    )
    (root / "app" / "workflows").mkdir(parents=True)
    shutil.copy2(REPO / "examples" / "shop.py", root / "app" / "workflows" / "shop.py")
    (root / "app" / "data").mkdir()
    env = image_environment(root, image)
    # The final stage's `RUN everystep --version`, as root.
    subprocess.run(as_image_user(root, image, ["--version"]), env=env, check=True)
    for path in [root, *root.rglob("*")]:
        if path != root / "app" / "data":
            path.chmod(path.stat().st_mode & ~0o222)
    os.chown(root / "app" / "data", IMAGE_USER, 0)
    (root / "app" / "data").chmod(0o775)
    yield root, image, env
    for path in [root, *root.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o200)
    shutil.rmtree(root)


def image_environment(root, image):
    """The image's ENV with its absolute paths moved under `root`."""

    def relocate(value):
        return value.replace("/opt/everystep", f"{root}/opt/everystep").replace(
            "/app", f"{root}/app"
        )

    env = clean_environment(**{key: relocate(value) for key, value in image["ENV"].items()})
    env["EVERYSTEP_WORKFLOWS"] = "shop"
    # The image's port, but a free one on loopback (a test server's).
    env["EVERYSTEP_METRICS_PORT"] = str(free_port())
    env["EVERYSTEP_METRICS_BIND"] = "127.0.0.1"
    return env


def as_image_user(root, image, args):
    """The image's ENTRYPOINT + `args`, relocated under `root`."""
    entrypoint = [
        part.replace("/opt/everystep", f"{root}/opt/everystep") for part in image["ENTRYPOINT"]
    ]
    return [*entrypoint, *args]


def tree_state(folder):
    """Every file under `folder`, with its size and modification time."""
    return {
        path: (path.stat().st_size, path.stat().st_mtime_ns)
        for path in folder.rglob("*")
        if path.is_file()
    }


def test_the_image_runs_as_any_uid_on_a_read_only_tree_answers_its_health_check_and_drains(
    image_root, spawn_process
):
    root, image, env = image_root
    assert image["USER"] == str(IMAGE_USER) and image["STOPSIGNAL"] == "SIGTERM"
    assert image["CMD"] == ["worker"] and image["WORKDIR"] == "/app"
    workdir = root / "app"
    # Any uid, as a platform that picks one runs it: in group 0, as in the
    # container, where /etc/passwd does not name it.
    user = {"user": UNPRIVILEGED, "group": 0, "extra_groups": []}

    def health_check():
        return subprocess.run(image["HEALTHCHECK"], env=env, capture_output=True, timeout=10)

    code_before = tree_state(root / "opt")
    worker = spawn_process(
        "image", as_image_user(root, image, image["CMD"]), env=env, cwd=workdir, **user
    )
    worker.wait_ready()
    order = '{"id": 1, "item": "lamp", "quantity": 1, "card": "tok"}'
    scheduled = subprocess.run(
        as_image_user(root, image, ["schedule", "fulfil_order", order]),
        env=env,
        cwd=workdir,
        capture_output=True,
        text=True,
        **user,
    )
    assert scheduled.returncode == 0, scheduled.stderr
    worker.wait_for_log(f"run {scheduled.stdout.strip()} shop.fulfil_order completed")
    assert health_check().returncode == 0
    worker.send(signal.SIGTERM)
    assert worker.wait() == 0, worker.log()
    assert "Permission denied" not in worker.log() and "Read-only" not in worker.log()
    assert tree_state(root / "opt") == code_before  # nothing written beside the code
    assert (root / "app" / "data" / "everystep.sqlite3").is_file()
    assert health_check().returncode != 0  # nothing answers once it has stopped


def test_another_uid_in_group_0_writes_the_sqlite_file_on_the_same_volume(
    image_root, spawn_process
):
    """The files the first uid creates in /app/data serve a second uid in
    group 0 (another platform-given uid, a one-off job): the database is
    writable by the group, as the directory is, and a worker restarted under
    the other uid takes its name's lock file again; a database file that is
    not writable says so, naming it."""
    root, image, env = image_root
    data = root / "app" / "data"

    def run_as(uid, *args):
        return subprocess.run(
            as_image_user(root, image, list(args)),
            env=env,
            cwd=root / "app",
            capture_output=True,
            text=True,
            user=uid,
            group=0,
            extra_groups=[],
            timeout=120,
        )

    migrated = run_as(IMAGE_USER, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    database = data / "everystep.sqlite3"
    assert database.stat().st_mode & 0o777 == 0o664 and database.stat().st_uid == IMAGE_USER
    order = '{"id": 2, "item": "desk", "quantity": 1, "card": "tok"}'
    scheduled = run_as(UNPRIVILEGED, "schedule", "fulfil_order", order)
    assert scheduled.returncode == 0, scheduled.stderr
    listed = run_as(IMAGE_USER, "runs")
    assert scheduled.stdout.strip() in listed.stdout, listed.stderr

    named = {**env, "EVERYSTEP_NAME": "shared-name"}
    for uid in (IMAGE_USER, UNPRIVILEGED):  # the same name, restarted under another uid
        worker = spawn_process(
            f"worker-{uid}",
            as_image_user(root, image, ["worker"]),
            env=named,
            cwd=root / "app",
            user=uid,
            group=0,
            extra_groups=[],
        )
        worker.wait_ready()
        worker.send(signal.SIGTERM)
        assert worker.wait() == 0, worker.log()

    database.chmod(0o644)
    refused = run_as(UNPRIVILEGED, "schedule", "fulfil_order", order)
    assert refused.returncode == 2, refused.stderr
    assert f"the SQLite file {database} is not writable by this user" in refused.stderr
    assert "Traceback" not in refused.stderr


def procfile():
    return dict(
        line.split(": ", 1) for line in (REPO / "Procfile").read_text().splitlines() if line.strip()
    )


@pytest.mark.django_db(transaction=True)
def test_the_procfile_migrates_on_release_and_runs_a_stable_named_worker_within_the_grace(
    spawn_process, tmp_path
):
    processes = procfile()
    assert set(processes) == {"release", "worker", "web"}
    env = clean_environment(
        DATABASE_URL=database_url(),  # as a Heroku-style platform sets it
        DYNO="worker.1",
        EVERYSTEP_WORKFLOWS="tests.workflows",
        EVERYSTEP_PATH=str(REPO),
        PATH=f"{pathlib.Path(sys.executable).parent}:{os.environ['PATH']}",
    )
    release = subprocess.run(
        ["bash", "-c", processes["release"]], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert release.returncode == 0, release.stderr

    worker = spawn_process("dyno", ["bash", "-c", processes["worker"]], env=env, cwd=tmp_path)
    worker.wait_ready()
    ready = next(line for line in worker.log().splitlines() if "ready" in line)
    assert "worker worker.1 ready" in ready
    drain = float(re.search(r"drain ([\d.]+)s", ready).group(1))
    assert 0 < drain < 30, "the drain must fit the platform's 30-second shutdown grace"
    run = Workflow.objects.create(name="tests.workflows.quick", args=[1])
    wait_until(lambda: Workflow.objects.get(id=run.id).status == "completed")
    worker.send(signal.SIGTERM)
    assert worker.wait(30) == 0


@pytest.mark.django_db(transaction=True)
def test_the_procfiles_web_process_serves_the_operator_ui_on_the_platforms_port(
    spawn_process, tmp_path
):
    import base64
    import urllib.request

    from tests.servers import free_port

    port = free_port()
    env = clean_environment(
        DATABASE_URL=database_url(),
        PORT=str(port),  # as a Heroku-style platform sets it
        EVERYSTEP_UI_PASSWORD="platform-secret",
        EVERYSTEP_UI_BIND="127.0.0.1",  # a test server listens on loopback only
        PATH=f"{pathlib.Path(sys.executable).parent}:{os.environ['PATH']}",
    )
    web = spawn_process("web", ["bash", "-c", procfile()["web"]], env=env, cwd=tmp_path)
    web.wait_for_log(f"operator UI serving on http://127.0.0.1:{port}/")
    run = Workflow.objects.create(name="tests.workflows.quick", args=[1])
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/runs",
        headers={"Authorization": "Basic " + base64.b64encode(b"admin:platform-secret").decode()},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert [listed["id"] for listed in json.load(response)["runs"]] == [str(run.id)]
    web.send(signal.SIGTERM)
    assert web.wait(30) == 0


def children(pid):
    return [
        int(child) for child in pathlib.Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    ]


def test_make_run_completes_the_example_runs_and_drains_on_sigint(pyz, tmp_path, spawn_process):
    copy = tmp_path / "everystep"
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    )
    for name in [*tracked.stdout.split(), "dist/everystep.pyz"]:
        if (REPO / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, copy / name)
    make = spawn_process("make-run", ["make", "run"], env=clean_environment(), cwd=copy)
    wait_until(
        lambda: make.log().count("completed in") >= 3, timeout=60, message="three orders completed"
    )
    assert "stopped" in make.log()  # the desk is out of stock: a Terminal stop
    [worker] = children(make.pid)
    os.kill(worker, signal.SIGINT)  # what Ctrl-C delivers to the worker
    assert make.wait(30) == 0, make.log()
    assert "worker example stopped" in make.log()
    assert "Traceback" not in make.log()
