"""The zipapp's start-up: from exec to the worker's ``ready`` line, cold (a
fresh extraction directory) and warm; its size."""

import os
import pathlib
import statistics
import subprocess
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
PYZ = ROOT / "dist" / "everystep.pyz"


def time_to_ready(url, shiv_root, workdir):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EVERYSTEP_", "DJANGO_"))}
    env.update(
        EVERYSTEP_DATABASE_URL=url,
        EVERYSTEP_WORKFLOWS="bench.workflows",
        EVERYSTEP_PATH=str(ROOT),
        SHIV_ROOT=str(shiv_root),
    )
    began = time.perf_counter()
    process = subprocess.Popen(
        [str(PYZ), "worker", "--name", "bench-startup"],
        env=env,
        cwd=workdir,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    try:
        for line in process.stderr:
            if " ready: " in line:
                return time.perf_counter() - began
        raise RuntimeError("the zipapp worker exited before it was ready")
    finally:
        process.terminate()
        process.wait(60)


def measure(url, workdir, repeat=3):
    if not PYZ.exists():
        return {"error": "dist/everystep.pyz is missing: run make pyz"}
    cold, warm = [], []
    for attempt in range(repeat):
        shiv_root = workdir / f"shiv-{attempt}"
        cold.append(time_to_ready(url, shiv_root, workdir))
        warm.append(time_to_ready(url, shiv_root, workdir))
    return {
        "zipapp_cold_start_s": statistics.median(cold),
        "zipapp_warm_start_s": statistics.median(warm),
        "zipapp_size_mib": PYZ.stat().st_size / 2**20,
    }
