"""The zipapp's start-up: ``dist/everystep.pyz worker`` from exec to its
``ready`` line, cold (a fresh ``SHIV_ROOT``: the first start extracts the
bundled dependencies, and the first import of each module writes its
bytecode there) and warm (the same ``SHIV_ROOT`` again); its size.
Warm also under a bare interpreter — a virtualenv of the same Python with
nothing installed, as in a slim container image: this machine's
``python3`` may have packages of its own that the bundled ones import when
they find them (environ-config imports boto3 for AWS secrets), which is
this machine's start-up, not the zipapp's.

The floor under any Django worker's start on PostgreSQL is measured beside
it, warm: the same bare interpreter starting and importing Django's ORM
(``django.db.models``) and the driver (``psycopg``) from the packages the
zipapp extracted.

Runs in the orchestrating process (the zipapp brings its own Django
settings); with no zipapp built, the figures are null and say why.
"""

import os
import subprocess
import threading
import time

from bench.common import ROOT, WorkerProcess, median

PYZ = ROOT / "dist" / "everystep.pyz"


def environment(url, shiv_root):
    """The zipapp's environment on the database at `url`."""
    # Nor PYTHONDONTWRITEBYTECODE: a user's zipapp writes the bytecode of
    # its extracted packages at its first start, and loads it after.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("EVERYSTEP_", "DJANGO_")) and k != "PYTHONDONTWRITEBYTECODE"
    }
    env.update(
        EVERYSTEP_DATABASE_URL=url,
        EVERYSTEP_WORKFLOWS="bench.workflows",
        EVERYSTEP_PATH=str(ROOT),
        SHIV_ROOT=str(shiv_root),
    )
    return env


def start(url, shiv_root, log_path, interpreter=None):
    """Seconds from exec to ready of one zipapp worker (run by
    `interpreter`, else by its shebang), which is then stopped."""
    env = environment(url, shiv_root)
    command = [str(PYZ), "worker", "--name", "bench-zipapp"]
    if interpreter is not None:
        command.insert(0, str(interpreter))
    worker = WorkerProcess("bench-zipapp", command, env, log_path)
    try:
        return worker.wait_ready(120)
    finally:
        worker.stop()


def django_import(url, shiv_root, interpreter):
    """Seconds for `interpreter` to start and import Django's ORM and
    psycopg from the packages the zipapp extracted under `shiv_root`, their
    bytecode written by its first start, in the zipapp's environment."""
    [site_packages] = shiv_root.glob("*/site-packages")
    path = f"import sys; sys.path.insert(0, {str(site_packages)!r})"
    code = f"{path}; import django.db.models, psycopg"
    env = environment(url, shiv_root)
    began = time.perf_counter()
    process = subprocess.Popen([str(interpreter), "-c", code], env=env)
    # Not `wait(timeout)`: it polls, up to 50 ms apart, which would add up
    # to 50 ms to the floor. A plain wait returns at the exit.
    deadline = threading.Timer(60, process.kill)
    deadline.start()
    try:
        status = process.wait()
    finally:
        deadline.cancel()
    elapsed = time.perf_counter() - began
    if status != 0:
        raise RuntimeError(f"importing Django and psycopg exited {status}")
    return elapsed


def measure(url, workdir, repeat=3):
    if not PYZ.exists():
        return {
            "cold_start_s": None,
            "warm_start_s": None,
            "size_mib": None,
            "note": "dist/everystep.pyz is missing: build it with `make pyz`",
        }
    # The zipapp's own apps (its UI's sessions too), as a user migrates.
    migrate_env = environment(url, workdir / "shiv-migrate")
    subprocess.run([str(PYZ), "migrate"], env=migrate_env, check=True, capture_output=True)
    bare = workdir / "bare-python"
    subprocess.run(["python3", "-m", "venv", "--without-pip", str(bare)], check=True)
    cold, warm, warm_bare, floor = [], [], [], []
    for attempt in range(repeat):
        shiv_root = workdir / f"shiv-{attempt}"
        log = workdir / f"zipapp-{attempt}.log"
        cold.append(start(url, shiv_root, log))
        warm.append(start(url, shiv_root, log))
        warm_bare.append(start(url, shiv_root, log, bare / "bin" / "python3"))
        floor.append(django_import(url, shiv_root, bare / "bin" / "python3"))
    return {
        "cold_start_s": median(cold),
        "warm_start_s": median(warm),
        "warm_start_bare_s": median(warm_bare),
        "django_import_bare_s": median(floor),
        "size_mib": PYZ.stat().st_size / 2**20,
    }
