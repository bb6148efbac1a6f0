"""Replay: resuming a run that has 1,000 recorded steps.

A run of 1,000 trivial steps is executed once, so all its steps are
recorded. Then, `repeat` times, it is put back to ``scheduled`` (as a
requeue after a crash would), claimed, and executed again: every step is
served from the store, none executes. Timed: the whole attempt, and the
loading of the recorded steps on its own; counted (Django
``execute_wrapper``): the statements of the attempt — one to load, one
finishing write.
"""

import time

from django.db import connection

from bench import workflows
from bench.common import RoundTrips, median
from everystep import schedule
from everystep.db import claims, steps
from everystep.engine import runner
from everystep.models import Workflow


def measure(count=1000, repeat=5):
    run = schedule(workflows.steps, count)
    runner.execute(claims.claim("bench-replay", 1)[0])
    if Workflow.objects.get(id=run.id).status != "completed":
        raise RuntimeError("the run to replay did not complete")
    attempts, loads, statements = [], [], []
    for index in range(repeat + 1):  # the first attempt warms up
        Workflow.objects.filter(id=run.id).update(status="scheduled", claimed_by=None)
        [claimed] = claims.claim("bench-replay", 1)
        trips = RoundTrips()
        with connection.execute_wrapper(trips):
            began = time.perf_counter()
            status = runner.execute(claimed)
            elapsed = time.perf_counter() - began
        if status != "completed":
            raise RuntimeError(f"the replayed run ended {status}")
        began = time.perf_counter()
        loaded, _ = steps.load_outcomes(run.id)
        load = time.perf_counter() - began
        if len(loaded) != count:
            raise RuntimeError(f"{len(loaded)} recorded steps, expected {count}")
        if index:
            attempts.append(elapsed)
            loads.append(load)
            statements.append(trips.count)
    return {
        "steps": count,
        "replay_ms": median(attempts) * 1e3,
        "load_ms": median(loads) * 1e3,
        "queries": median(statements),
    }
