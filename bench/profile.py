"""Where a worker's CPU goes: one worker process (pool 8) drains `runs`
five-step runs (after 200 of warm-up, left out) under yappi
(`bench.profiled_worker`), every thread
profiled on its own CPU clock, so a function's time is CPU spent in it,
not a wait for the database. A profiler slows Python down, the more where
calls are many and small: the figures are shares of one profile, to
compare with one another, and the CPU per run is the profiled one.

- the CPU per run, and its shares by layer: the driver (psycopg), Django,
  the engine (``everystep``), JSON, logging, the rest;
- the twenty functions with the most CPU of their own, and the engine's
  twenty with the most CPU with what they call.

The whole profile, sorted by CPU of its own, is written to
``bench/out/profile.txt``.
"""

import collections
import io
import os
import pstats
import signal
import sys

from bench import db, workflows
from bench.common import ROOT, WorkerProcess, child_environment, wait_for

OUT = ROOT / "bench" / "out" / "profile.txt"
LAYERS = (  # (name, a fragment of a function's file path), the first match wins
    ("driver (psycopg)", "/psycopg"),
    ("Django", "/django/"),
    ("engine (everystep)", "/everystep/"),
    ("JSON", "/json/"),
    ("logging", "/logging/"),
)


def layer(filename):
    for name, fragment in LAYERS:
        if fragment in filename:
            return name
    return "other"


def label(function):
    filename, line, name = function
    short = filename.split("site-packages/")[-1].removeprefix(str(ROOT) + "/")
    return f"{name} ({short}:{line})"


def shares(stats, runs):
    rows = stats.stats  # function → (calls, primitive calls, own time, cumulative, callers)
    total = sum(own for _, _, own, _, _ in rows.values()) or 1e-9
    by_layer = collections.Counter()
    for function, (_, _, own, _, _) in rows.items():
        by_layer[layer(function[0])] += own
    own_top = sorted(rows.items(), key=lambda item: item[1][2], reverse=True)[:20]
    engine = [item for item in rows.items() if "/everystep/" in item[0][0]]
    cumulative_top = sorted(engine, key=lambda item: item[1][3], reverse=True)[:20]
    return {
        "cpu_ms_per_run": total / runs * 1e3,
        "layers": {name: seconds / total for name, seconds in by_layer.most_common()},
        "self_top": [[label(f), row[2] / total, row[1]] for f, row in own_top],
        "inclusive_top": [[label(f), row[3] / total, row[1]] for f, row in cumulative_top],
    }


def measure(runs=2000, pool=8, log_dir=".", timeout=300):
    url = os.environ["EVERYSTEP_DATABASE_URL"]
    path = OUT.with_suffix(".pstats")
    command = [sys.executable, "-m", "bench.profiled_worker", "--name", "profile"]
    command += ["--pool", str(pool)]
    env = {**child_environment(url), "BENCH_PROFILE": str(path)}
    worker = WorkerProcess("profile", command, env, f"{log_dir}/profile.log")
    try:
        worker.wait_ready(120)
        db.schedule_many(workflows.five_steps, 200)  # warm-up: connections, statements
        wait_for(lambda: db.unfinished() == 0, timeout, "the warm-up to finish", 0.02)
        db.clear_runs()
        worker.process.send_signal(signal.SIGUSR1)  # the profile starts afresh
        db.schedule_many(workflows.five_steps, runs)
        wait_for(lambda: db.unfinished() == 0, timeout, f"{runs} runs to finish", 0.02)
    finally:
        worker.stop()
    stats = pstats.Stats(str(path))
    text = io.StringIO()
    pstats.Stats(str(path), stream=text).sort_stats("tottime").print_stats(80)
    OUT.write_text(text.getvalue())
    path.unlink(missing_ok=True)
    return {"runs": runs, **shares(stats, runs)}
