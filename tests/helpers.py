"""Helpers the tests share: run a workflow through the real runner, read
what it recorded, simulate a crash, wait on a condition with a deadline."""

import time

import pytest

WORKER = "tests"


def claim_one(worker=WORKER, *, parked=False):
    """Claim exactly one run (the test's) and return it."""
    from everystep import store

    claimed = store.claim(worker, 1, only_parked=parked)
    assert len(claimed) == 1, f"expected one run to claim, got {claimed}"
    return claimed[0]


def attempt(*, parked=False):
    """Claim the test's run and execute one attempt of it; return the status."""
    from everystep import runner

    return runner.execute(claim_one(parked=parked))


def run_to_end(func, *args):
    """Schedule `func(*args)`, execute it once, and return its refreshed row."""
    from everystep import schedule

    run = schedule(func, *args)
    attempt()
    run.refresh_from_db()
    return run


def recorded_steps(run):
    """The run's step rows as {step_id: (name, status, result)}."""
    return {
        s.step_id: (s.name.rsplit(".", 1)[-1], s.status, s.result)
        for s in run.steps.order_by("id")
    }


def crash_at(step_id):
    """A fault hook that simulates a process death right after `step_id` ran."""
    from everystep.errors import SimulatedCrash

    def fault(ctx, current_step_id):
        if current_step_id == step_id:
            raise SimulatedCrash(step_id)

    return fault


def wait_until(condition, timeout=30.0, interval=0.02, message="condition"):
    """Poll `condition` until it returns a truthy value, which is returned;
    fail the test if `timeout` seconds pass first."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)
