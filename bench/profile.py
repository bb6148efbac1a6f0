"""Where a worker's CPU goes: one worker process (pool 8) drains `runs`
five-step runs while py-spy samples every thread of it, 250 times a
second. The stacks are folded into shares of the samples:

- by layer — the driver (psycopg), Django, the engine (``everystep``),
  the standard library's JSON and logging, and the idle waits;
- by function, the twenty that hold the most samples on their own (self)
  and with what they call (inclusive), the engine's and the driver's.

The whole folded profile is written to ``bench/out/profile.txt`` (one
line per stack, ``frame;frame;… samples``, as flame graph tools read it).
A sampler costs the process it samples little, but the figures are shares
of one profile, not timings: compare them with one another.
"""

import collections
import os
import signal
import subprocess
import time

from bench import db, workflows
from bench.common import ROOT, Workers, wait_for

OUT = ROOT / "bench" / "out" / "profile.txt"
LAYERS = (  # (name, a fragment of a frame's file path), the first match wins
    ("driver (psycopg)", "/psycopg/"),
    ("Django", "/django/"),
    ("engine (everystep)", "/everystep/"),
    ("JSON", "/json/"),
    ("logging", "/logging/"),
)
IDLE = ("wait (threading.py)", "select", "poll", "notifies", "_wait_for_tstate_lock")


def py_spy():
    return str(ROOT / ".venv" / "bin" / "py-spy")


def fold(path):
    """``{stack (a tuple of frames, outermost first): samples}``."""
    stacks = collections.Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            stacks[tuple(stack.split(";"))] += int(count)
    return stacks


def idle(stack):
    """Whether a stack is a thread waiting: its innermost frames wait."""
    return any(marker in frame for frame in stack[-3:] for marker in IDLE)


def layer(frame):
    for name, fragment in LAYERS:
        if fragment in frame:
            return name
    return "other"


def shares(stacks):
    busy = {stack: n for stack, n in stacks.items() if not idle(stack)}
    total = sum(busy.values()) or 1
    by_layer = collections.Counter()
    own = collections.Counter()
    inclusive = collections.Counter()
    for stack, samples in busy.items():
        by_layer[layer(stack[-1])] += samples
        own[stack[-1]] += samples
        for frame in set(stack):
            inclusive[frame] += samples
    return {
        "busy_samples": total,
        "idle_samples": sum(stacks.values()) - total,
        "layers": {name: n / total for name, n in by_layer.most_common()},
        "self_top": [(frame, n / total) for frame, n in own.most_common(20)],
        "inclusive_top": [
            (frame, n / total)
            for frame, n in inclusive.most_common(200)
            if "/everystep/" in frame or "/psycopg/" in frame
        ][:20],
    }


def measure(runs=2000, pool=8, log_dir=".", timeout=300):
    url = os.environ["EVERYSTEP_DATABASE_URL"]
    raw = OUT.with_suffix(".raw")
    with Workers(1, ["--pool", str(pool)], url, log_dir, prefix="profile") as group:
        group.wait_ready()
        db.schedule_many(workflows.five_steps, 200)  # warm-up
        wait_for(lambda: db.unfinished() == 0, timeout, "the warm-up to finish", 0.02)
        db.clear_runs()
        sampler = subprocess.Popen(
            [
                py_spy(),
                "record",
                "--pid",
                str(group.all[0].pid),
                "--rate",
                "250",
                "--format",
                "raw",
                "--nonblocking",
                "--output",
                str(raw),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            time.sleep(0.5)  # py-spy attaches: the drain must not start before
            if sampler.poll() is not None:
                raise RuntimeError(f"py-spy exited: {sampler.stderr.read().strip()}")
            db.schedule_many(workflows.five_steps, runs)
            began = time.perf_counter()
            wait_for(lambda: db.unfinished() == 0, timeout, f"{runs} runs to finish", 0.02)
            elapsed = time.perf_counter() - began
        finally:
            sampler.send_signal(signal.SIGINT)
            sampler.wait(60)
    stacks = fold(raw)
    OUT.write_text("".join(f"{';'.join(stack)} {n}\n" for stack, n in stacks.most_common()))
    raw.unlink(missing_ok=True)
    return {"runs": runs, "seconds": elapsed, **shares(stacks)}
