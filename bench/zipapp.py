"""The zipapp's start-up: ``dist/everystep.pyz worker`` from exec to its
``ready`` line, cold (a fresh ``SHIV_ROOT``: the first start extracts the
bundled dependencies) and warm (the same ``SHIV_ROOT`` again); its size.

Runs in the orchestrating process (the zipapp brings its own Django
settings); with no zipapp built, the figures are null and say why.
"""

import os

from bench.common import ROOT, WorkerProcess, median

PYZ = ROOT / "dist" / "everystep.pyz"


def start(url, shiv_root, log_path):
    """Seconds from exec to ready of one zipapp worker, which is then stopped."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EVERYSTEP_", "DJANGO_"))}
    env.update(
        EVERYSTEP_DATABASE_URL=url,
        EVERYSTEP_WORKFLOWS="bench.workflows",
        EVERYSTEP_PATH=str(ROOT),
        SHIV_ROOT=str(shiv_root),
    )
    worker = WorkerProcess(
        "bench-zipapp", [str(PYZ), "worker", "--name", "bench-zipapp"], env, log_path
    )
    try:
        return worker.wait_ready(120)
    finally:
        worker.stop()


def measure(url, workdir, repeat=3):
    if not PYZ.exists():
        return {
            "cold_start_s": None,
            "warm_start_s": None,
            "size_mib": None,
            "note": "dist/everystep.pyz is missing: build it with `make pyz`",
        }
    cold, warm = [], []
    for attempt in range(repeat):
        shiv_root = workdir / f"shiv-{attempt}"
        log = workdir / f"zipapp-{attempt}.log"
        cold.append(start(url, shiv_root, log))
        warm.append(start(url, shiv_root, log))
    return {
        "cold_start_s": median(cold),
        "warm_start_s": median(warm),
        "size_mib": PYZ.stat().st_size / 2**20,
    }
