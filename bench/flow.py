"""Flow control: a limited queue's throughput against its limit, and a rate
limit's accuracy, with real worker processes.

Concurrency: `runs` runs of a queue of concurrency 8, each holding one
step for `hold` seconds, are drained by two workers of pool 8 (16 slots
for 8). From the steps' recorded start and end times come the most that
ever ran at once (never above 8), the time-weighted mean that ran at once
while the queue drained (8 would be every slot of the limit filled all the
time), and the throughput against the limit's ideal, 8 / `hold` runs a
second.

Rate: `rated` runs of a queue limited to 20 starts a second, scheduled at
once, drained by the same two workers: the most first starts in any
one-second window (never above 20), and how late each held run started
after the moment the window let it: the ``i``-th start may come one window
after the ``(i - 20)``-th. A held run should be late by no more than a poll
(0.2 s here) and a claim.
"""

import datetime
import os
import time

from bench import db
from bench.common import Workers, wait_for
from everystep.db import queues as queue_rows
from everystep.models import Step, Workflow

WORKFLOWS = {"BENCH_WORKFLOWS": "bench.workflows,bench.flow_workflows"}


def measure(runs=200, hold=0.2, rated=200, log_dir=".", timeout=300):
    from bench import flow_workflows

    queue_rows.declare([flow_workflows.LIMITED, flow_workflows.RATED])
    url = os.environ["EVERYSTEP_DATABASE_URL"]
    flags = ["--pool", "8", "--poll", "0.2"]
    with Workers(2, flags, url, log_dir, prefix="bench-flow", env=WORKFLOWS) as group:
        group.wait_ready()
        db.schedule_many(flow_workflows.limited, 16, args=[0.0])  # warm-up
        wait_for(lambda: db.unfinished() == 0, timeout, "the warm-up")
        db.clear_runs()
        limit = flow_workflows.LIMITED.concurrency
        began = time.perf_counter()
        db.schedule_many(flow_workflows.limited, runs, args=[hold])
        wait_for(lambda: db.unfinished() == 0, timeout, f"{runs} limited runs", interval=0.05)
        seconds = time.perf_counter() - began
        spans = list(Step.objects.values_list("started_at", "finished_at"))
        most, mean = _overlap(spans)
        db.clear_runs()
        db.schedule_many(flow_workflows.rated, rated)
        wait_for(lambda: db.unfinished() == 0, timeout, f"{rated} rated runs", interval=0.05)
        starts = sorted(Workflow.objects.values_list("started_at", flat=True))
    rate_limit, window = flow_workflows.RATED.rate
    span = datetime.timedelta(seconds=window)
    in_window = max(sum(1 for other in starts if start <= other < start + span) for start in starts)
    late = sorted(
        (starts[i] - (starts[i - rate_limit] + span)).total_seconds()
        for i in range(rate_limit, len(starts))
    )
    return {
        "concurrency_limit": limit,
        "most_running": most,
        "mean_running": mean,
        "mean_running_of_limit": mean / limit,
        "limited_runs_per_s": runs / seconds,
        "limited_of_ideal": runs / seconds / (limit / hold),
        "rate_limit_per_s": rate_limit / window,
        "most_starts_in_a_window": in_window,
        "held_late_median_s": late[len(late) // 2],
        "held_late_max_s": late[-1],
    }


def _overlap(spans):
    """The most `spans` overlapping at once, and the time-weighted mean
    overlap from the first start to the last end."""
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    now = most = 0
    weighted = 0.0
    previous = edges[0][0]
    for moment, change in edges:
        weighted += now * (moment - previous).total_seconds()
        previous = moment
        now += change
        most = max(most, now)
    total = (edges[-1][0] - edges[0][0]).total_seconds()
    return most, weighted / total
