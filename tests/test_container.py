"""The container image, built from the Dockerfile and run.

No Docker daemon and no container registry: buildah builds the Dockerfile
and podman runs the image, both as root on a storage of their own under
.run/container. The base image is made here, from Debian's packages, by
debootstrap from the archive this machine's apt uses: Debian's python3 with
its venv module, which builds the zipapp and runs the image as a python
image's would. The base is kept, keyed by what went into it, so a rerun
builds on it at once; without one, and no way to make it, the test fails
in one line.

The image runs as a random uid with a read-only root filesystem, without
a network, the example shop workflows mounted: it completes a run into
the SQLite file of its /app/data volume, its health check passes, and
`podman stop` drains it to exit 0. The sizes and durations go to
test-artifacts/container.json. One backend only: the container brings its
own database.
"""

import contextlib
import fcntl
import hashlib
import json
import os
import pathlib
import random
import resource
import shutil
import signal
import sqlite3
import subprocess
import tempfile
import time
import tomllib

import pytest

from tests.helpers import wait_until
from tests.workerproc import REPO

pytestmark = pytest.mark.backends("sqlite")

CACHE = REPO / ".run" / "container"
BASE = "localhost/everystep-test-base"
IMAGE = "localhost/everystep-test"
NAME = "everystep-container-test"  # the container's and the worker's name
TOOLS = ("buildah", "podman", "runc", "debootstrap")
# What the base holds beyond Debian's minimal system: a python image's python3.
PACKAGES = ("python3", "python3-venv")
DEBOOTSTRAP_TIMEOUT = 300  # seconds; it takes one or two
BASE_RECIPE = 1  # bump to make the base anew after a change to how it is made
CA_BUNDLE = pathlib.Path("/etc/ssl/certs/ca-certificates.crt")
STOP_TIMEOUT = 40  # seconds, above the worker's default drain of 30
ORDER = '{"id": 1, "item": "lamp", "quantity": 1, "card": "tok"}'


def fail(message):
    pytest.fail(message, pytrace=False)


class Engine:
    """buildah and podman on a storage of their own under `folder`."""

    def __init__(self, folder):
        storage = [
            *("--root", str(folder / "storage"), "--runroot", str(folder / "run")),
            *("--storage-driver", "vfs"),
        ]
        self._buildah = ["buildah", *storage]
        # runc, cgroupfs and a file for the events: no systemd here.
        self._podman = [
            "podman",
            *storage,
            "--tmpdir",
            str(folder / "libpod"),
            "--runtime",
            "runc",
            "--cgroup-manager",
            "cgroupfs",
            "--events-backend",
            "file",
        ]

    def podman(self, *args, check=True, timeout=120):
        return self._run(self._podman, args, check, timeout)

    def buildah(self, *args, check=True, timeout=120, log=None):
        return self._run(self._buildah, args, check, timeout, log)

    @staticmethod
    def _run(tool, args, check, timeout, log=None):
        command = [*tool, *map(str, args)]
        if log is None:
            result = subprocess.run(
                command, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
            )
            output = result.stdout + result.stderr
        else:
            with open(log, "w") as out:
                result = subprocess.run(
                    command,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=timeout,
                    stdin=subprocess.DEVNULL,
                )
            output = pathlib.Path(log).read_text(errors="replace")
        if check and result.returncode != 0:
            tail = "\n".join(output.splitlines()[-30:])
            fail(
                f"`{tool[0]} {' '.join(map(str, args))[:200]}` exited {result.returncode}:\n{tail}"
            )
        return result

    def inspect(self, kind, name):
        return json.loads(self.podman(kind, "inspect", name).stdout)[0]

    def logs(self, name):
        result = self.podman("logs", name, check=False)
        return result.stdout + result.stderr

    def remove_container(self, name):
        self.podman("rm", "--force", "--volumes", "--ignore", name, check=False)


# The base image


def os_release():
    fields = {}
    for line in pathlib.Path("/etc/os-release").read_text().splitlines():
        key, _, value = line.partition("=")
        fields[key] = value.strip('"')
    return fields


def apt_archive(codename):
    """``(uri, keyring or None)`` of the Debian archive this machine's apt
    takes `codename` from (deb822 .sources or one-line .list), or None."""
    sources = pathlib.Path("/etc/apt")
    for path in sorted(sources.glob("sources.list.d/*.sources")):
        for stanza in path.read_text().split("\n\n"):
            fields = {}
            for line in stanza.splitlines():
                if line and not line.startswith(("#", " ")) and ":" in line:
                    key, _, value = line.partition(":")
                    fields[key.strip().lower()] = value.strip()
            if (
                "deb" in fields.get("types", "").split()
                and codename in fields.get("suites", "").split()
                and fields.get("enabled", "yes") != "no"
                and fields.get("uris")
            ):
                return fields["uris"].split()[0], fields.get("signed-by")
    for path in [sources / "sources.list", *sorted(sources.glob("sources.list.d/*.list"))]:
        if not path.is_file():
            continue
        for line in path.read_text().splitlines():
            words = [word for word in line.split("#")[0].split() if not word.startswith("[")]
            if len(words) >= 3 and words[0] == "deb" and words[2] == codename:
                return words[1], None
    return None


def ca_bundle():
    """This machine's CA bundle: builds reach PyPI as its own pip does, also
    behind a proxy that inspects TLS with a certificate of its own."""
    return CA_BUNDLE.read_bytes() if CA_BUNDLE.is_file() else b""


@contextlib.contextmanager
def locked(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def base_image(engine):
    """The tag of the base image, made first when the storage lacks it;
    returns ``(tag, seconds spent making it, or 0)``."""
    codename = os_release().get("VERSION_CODENAME", "")
    archive = apt_archive(codename) if codename else None
    if archive is None:
        fail(
            "cannot make the base image: no Debian apt source for this machine's release "
            f"({codename or 'unknown'}) in /etc/apt"
        )
    uri, keyring = archive
    recipe = [BASE_RECIPE, codename, uri, PACKAGES, hashlib.sha256(ca_bundle()).hexdigest()]
    tag = f"{BASE}:{hashlib.sha256(json.dumps(recipe).encode()).hexdigest()[:12]}"
    with locked(CACHE / "base.lock"):
        exists = engine.podman("image", "exists", tag, check=False)
        if exists.returncode not in (0, 1):  # 1: no such image
            # A storage podman refuses (it records its absolute paths: the
            # repository moved, say) is only a cache: start it anew.
            for folder in ("storage", "run", "libpod"):
                shutil.rmtree(CACHE / folder, ignore_errors=True)
            exists = engine.podman("image", "exists", tag, check=False)
            if exists.returncode not in (0, 1):
                fail(f"podman cannot use its storage in {CACHE}: {exists.stderr.strip()}")
        if exists.returncode == 0:
            return tag, 0.0
        started = time.monotonic()
        work = pathlib.Path(tempfile.mkdtemp(prefix="base-", dir=CACHE))
        try:
            rootfs = work / "rootfs"
            debootstrap(codename, uri, keyring, rootfs)
            slim(rootfs)
            tarball = work / "rootfs.tar"
            subprocess.run(
                ["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(tarball), "."], check=True
            )
            engine.podman(
                "import",
                "--change",
                "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "--change",
                "ENV LANG=C.UTF-8",
                "--change",
                f"ENV PIP_CERT={CA_BUNDLE}",
                "--change",
                'CMD ["python3"]',
                tarball,
                tag,
            )
        finally:
            shutil.rmtree(work, ignore_errors=True)
        for other in engine.podman("images", "--format", "{{.Repository}}:{{.Tag}}").stdout.split():
            if other.startswith(f"{BASE}:") and other != tag:
                engine.podman("rmi", other, check=False)
        return tag, time.monotonic() - started


def debootstrap(codename, uri, keyring, rootfs):
    log = CACHE / "debootstrap.log"
    command = [
        "debootstrap",
        "--variant=minbase",
        f"--include={','.join(PACKAGES)}",
        *([f"--keyring={keyring}"] if keyring else []),
        codename,
        str(rootfs),
        uri,
    ]
    with open(log, "w") as out:
        process = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its downloads end with it
        )
    try:
        returncode = process.wait(timeout=DEBOOTSTRAP_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        fail(
            f"cannot make the base image: debootstrap from {uri} timed out after "
            f"{DEBOOTSTRAP_TIMEOUT}s ({log})"
        )
    if returncode != 0:
        last = log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
        fail(f"cannot make the base image: debootstrap from {uri} failed: {last[0]} ({log})")


def slim(rootfs):
    """Drop what an image never uses (downloaded packages, the package
    lists, documentation), as a slim base does; take this machine's CAs."""
    for pattern in ("var/cache/apt/archives/*.deb", "var/lib/apt/lists/*"):
        for path in rootfs.glob(pattern):
            if path.is_file():
                path.unlink()
    for folder in ("usr/share/doc", "usr/share/man", "usr/share/locale"):
        shutil.rmtree(rootfs / folder, ignore_errors=True)
    if ca_bundle():
        (rootfs / str(CA_BUNDLE).lstrip("/")).write_bytes(ca_bundle())


# The image


@pytest.fixture(scope="module")
def engine():
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        fail(f"{', '.join(missing)} missing: run scripts/install-test-deps")
    return Engine(CACHE)


@pytest.fixture(scope="module")
def image(engine, request):
    """The image built from the Dockerfile on the local base; its facts and
    timings are recorded when the module's tests are done."""
    started = time.monotonic()
    record = {}
    base, record["base_seconds"] = base_image(engine)
    built = time.monotonic()
    engine.buildah(
        "bud",
        "--isolation",
        "chroot",
        "--format",
        "docker",  # the OCI format has no HEALTHCHECK
        "--pull=never",  # no registry: the base is local
        "--build-arg",
        f"BASE={base}",
        "--tag",
        IMAGE,
        "--file",
        REPO / "Dockerfile",
        REPO,
        timeout=480,
        log=CACHE / "build.log",
    )
    record["build_seconds"] = time.monotonic() - built
    record["image_bytes"] = engine.inspect("image", IMAGE)["Size"]
    record["base_bytes"] = engine.inspect("image", base)["Size"]
    yield IMAGE
    engine.remove_container(NAME)
    engine.podman("rmi", "--force", IMAGE, check=False)
    record["seconds"] = time.monotonic() - started
    artifacts = pathlib.Path(os.environ.get("EVERYSTEP_TEST_ARTIFACTS") or REPO / "test-artifacts")
    artifacts.mkdir(parents=True, exist_ok=True)
    (artifacts / "container.json").write_text(json.dumps(record, indent=2) + "\n")
    image_mb, base_mb = record["image_bytes"] / 1e6, record["base_bytes"] / 1e6
    report(
        request.config,
        f"container image {image_mb:.1f} MB: its base {base_mb:.1f} MB + "
        f"{image_mb - base_mb:.1f} MB; base made in {record['base_seconds']:.0f}s, "
        f"image built in {record['build_seconds']:.0f}s, all in {record['seconds']:.0f}s",
    )


def report(config, line):
    """Show `line` in the test run's output, past the capture."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line("\n" + line)


def test_the_image_holds_one_read_only_copy_of_the_code_and_declares_its_contract(engine, image):
    config = engine.inspect("image", image)
    assert config["Config"]["Volumes"] == {"/app/data": {}}
    assert config["Config"]["ExposedPorts"] == {"9464/tcp": {}}
    assert "EVERYSTEP_METRICS_PORT=9464" in config["Config"]["Env"]
    assert config["Config"]["User"] == "10001" and config["Config"]["StopSignal"] == "SIGTERM"
    health = config["Healthcheck"]["Test"]
    assert health[:2] == ["CMD", "python3"] and "/healthz" in health[-1]
    labels = config["Labels"]
    assert labels["org.opencontainers.image.title"] == "everystep"
    assert labels["org.opencontainers.image.licenses"] == "MIT"
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert labels["org.opencontainers.image.version"] == version
    assert labels["org.opencontainers.image.base.name"].startswith(BASE)
    assert {"org.opencontainers.image.description", "org.opencontainers.image.source"} <= set(
        labels
    )

    root = pathlib.Path(engine.podman("image", "mount", image).stdout.strip())
    try:
        clis, zipapps = [], []
        for folder, _dirs, files in os.walk(root):
            here = pathlib.Path(folder)
            zipapps += [here / name for name in files if name.endswith(".pyz")]
            if here.name == "everystep_runtime" and "cli.py" in files:
                clis.append(here.relative_to(root))
        assert clis == [pathlib.Path("opt/everystep/site-packages/everystep_runtime")]
        assert zipapps == []
        # The code's bytecode is in the image, compiled once at its build:
        # a start on the read-only copy loads it instead of compiling.
        packages = root / "opt/everystep/site-packages"
        for module in ("django/db/models/base", "everystep/engine/runner", "psycopg/cursor"):
            source = packages / f"{module}.py"
            compiled = list(source.parent.glob(f"__pycache__/{source.stem}.cpython-*.pyc"))
            assert len(compiled) == 1, f"no bytecode for {source}"
            flags = int.from_bytes(compiled[0].read_bytes()[4:8], "little")
            assert flags == 0b01, "hash-based and unchecked: no timestamp to go stale"
        assert os.readlink(root / "usr/local/bin/everystep") == "/opt/everystep/bin/everystep"
    finally:
        engine.podman("image", "unmount", image, check=False)


def ulimits():
    """podman asks for more open files than a process here may raise its
    limit to (root without CAP_SYS_RESOURCE): ask for what the host has."""
    options = []
    for name, limit in (("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC)):
        hard = resource.getrlimit(limit)[1]
        value = 4096 if hard == resource.RLIM_INFINITY else min(hard, 4096)
        options += ["--ulimit", f"{name}={value}:{value}"]
    return options


def wait_for_log(engine, text, timeout=60):
    def seen():
        if text in engine.logs(NAME):
            return True
        if engine.inspect("container", NAME)["State"]["Status"] != "running":
            fail(f"the container stopped before logging {text!r}:\n{engine.logs(NAME)}")
        return False

    wait_until(seen, timeout=timeout, interval=0.2, message=repr(text))


def test_the_image_runs_a_workflow_read_only_as_any_uid_into_its_volume_and_drains_on_stop(
    engine, image
):
    uid = random.randrange(20000, 60000)  # not the image's 10001, in no /etc/passwd
    engine.remove_container(NAME)
    engine.podman(
        "run",
        "--detach",
        "--name",
        NAME,
        "--env",
        f"EVERYSTEP_NAME={NAME}",
        "--env",
        "EVERYSTEP_WORKFLOWS=shop",
        "--volume",
        f"{REPO / 'examples'}:/app/workflows:ro",
        "--read-only",
        "--read-only-tmpfs=false",  # no writable /tmp either, as with Docker's --read-only
        "--user",
        uid,
        "--stop-timeout",
        STOP_TIMEOUT,
        "--network",
        "none",  # the worker needs none: SQLite, and probes on its loopback
        "--health-interval",
        "disable",  # no timer (no systemd): run by hand below
        *ulimits(),
        image,
    )
    wait_for_log(engine, f"worker {NAME} ready")
    ready = next(line for line in engine.logs(NAME).splitlines() if f"worker {NAME} ready" in line)
    assert "drain 30.0s" in ready and STOP_TIMEOUT > 30, ready

    scheduled = engine.podman("exec", NAME, "everystep", "schedule", "fulfil_order", ORDER)
    run_id = scheduled.stdout.strip()
    wait_for_log(engine, f"run {run_id} shop.fulfil_order completed")

    health = engine.podman("healthcheck", "run", NAME, check=False)
    assert health.returncode == 0, health.stdout + health.stderr
    assert engine.inspect("container", NAME)["State"]["Health"]["Status"] == "healthy"

    [data] = [
        mount
        for mount in engine.inspect("container", NAME)["Mounts"]
        if mount["Destination"] == "/app/data"
    ]
    assert data["Type"] == "volume", data
    volume = pathlib.Path(data["Source"])

    stopping = time.monotonic()
    engine.podman("stop", NAME, timeout=STOP_TIMEOUT + 30)
    stopped_in = time.monotonic() - stopping
    state = engine.inspect("container", NAME)["State"]
    log = engine.logs(NAME)
    assert state["ExitCode"] == 0, log
    assert f"worker {NAME} received SIGTERM: draining" in log and f"worker {NAME} stopped" in log
    assert stopped_in < 30, f"stop took {stopped_in:.1f}s"
    assert "Traceback" not in log and "Read-only" not in log and "Permission denied" not in log

    database = volume / "everystep.sqlite3"
    assert database.is_file() and database.stat().st_uid == uid
    assert all(path.name.startswith("everystep.sqlite3") for path in volume.iterdir())
    with contextlib.closing(sqlite3.connect(database)) as connection:
        rows = connection.execute("SELECT name, status FROM everystep_workflow").fetchall()
    assert rows == [("shop.fulfil_order", "completed")]
