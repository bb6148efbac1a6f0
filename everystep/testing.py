"""Run workflows in a project's own tests: to their end, on the test's
thread, inside its transaction — and crash them on purpose.

::

    from django.test import TestCase
    from everystep import schedule, testing

    class OrderTests(TestCase):
        def test_an_order_is_fulfilled(self):
            run = schedule(fulfil_order, {"id": 7})
            testing.run_scheduled()
            run.refresh_from_db()
            self.assertEqual(run.status, "completed")

`run_scheduled` works the same in a `TestCase` (the runs the test
scheduled are in its open transaction, which it runs inside), a
`TransactionTestCase`, and under pytest-django's ``db`` and
``transactional_db`` fixtures, on every database. It runs each run as a
worker would — steps recorded, replay, retries — but on the calling
thread, so nothing is left behind when the test ends: no thread, no
process, no file.
"""

import contextlib
import datetime

from django.db import connections

from everystep.core import clock, queues, registry
from everystep.db import claims
from everystep.db import queues as queue_rows
from everystep.engine import context, runner
from everystep.errors import EverystepError, SimulatedCrash
from everystep.models import Workflow

#: The worker name the runs are claimed under while a test runs them.
WORKER = "everystep-testing"


def run_scheduled(*, until=None, max_attempts=1000):
    """Run every scheduled run that is due, one attempt after another on
    this thread, until none is; return the runs it ran, as they are now
    (`everystep.models.Workflow` rows), in the order they first ran.

    With `until` (an aware datetime, or a `timedelta` or seconds from now),
    the engine's clock jumps ahead to each next due time up to that moment
    instead of waiting for it: a delayed start, a durable `sleep()` or a
    retry's wait comes due at once. A run still not due after it stays
    ``scheduled``.

    The queues declared in the test's modules hold their limits as a
    worker's would: a run a queue's rate holds back stays ``scheduled``.

    A run a crash left ``running`` (`crash_after`) is taken back first and
    resumed, as a restarted worker takes back its own runs. Runs that crash
    during this call stay ``running`` until the next call.

    `EverystepError` after `max_attempts` attempts: a workflow that never
    ends (one that sleeps in a loop, with `until` far ahead).
    """
    horizon = _horizon(until)
    order = {}  # run id → None, in the order they first ran
    attempts = 0

    def attempt(claimed):
        nonlocal attempts
        if attempts >= max_attempts:
            raise EverystepError(
                f"run_scheduled() stopped after {max_attempts} attempts: "
                f"a workflow that never ends?"
            )
        attempts += 1
        order.setdefault(claimed.fence.run_id, None)
        runner.execute(claimed)

    with _in_this_transaction(), _clock_that_jumps() as jump_to:
        queue_rows.declare(queues.declared().values())
        for claimed in claims.claim(WORKER, max_attempts, only_parked=True):
            attempt(claimed)
        while True:
            claimed = claims.claim(WORKER, 1)
            if claimed:
                attempt(claimed[0])
                continue
            due = claims.next_due() if horizon is not None else None
            if due is None or due > horizon or due <= clock.now():
                break  # nothing more comes due, or what is due is locked elsewhere
            jump_to(due)
    ran = Workflow.objects.in_bulk(list(order))
    return [ran[run_id] for run_id in order if run_id in ran]


@contextlib.contextmanager
def crash_after(step):
    """Within the block, simulate a crash the first time the step `step`
    ends (returns or raises) in a run: its effect has happened, its outcome
    is not recorded, and the run is left ``running`` — exactly as a worker
    killed at that moment leaves it. `step` is the step function, its name,
    or a step id (``"2"``, ``"3.1.1"``).

    ::

        with testing.crash_after(charge_card):
            testing.run_scheduled()      # charges, then "dies"
        testing.run_scheduled()          # resumes: charges again, or blocks
                                         # the run if the step is unsafe_to_repeat

    `AssertionError` at the end of the block when no such step ran.
    """
    wanted = getattr(step, "__everystep_step__", step)
    if not isinstance(wanted, str):
        raise TypeError(f"crash_after() takes a step function, its name or a step id, not {step!r}")
    crashed = []

    previous = runner.fault

    def fault(ctx, step_id, name):
        if not crashed and wanted in (step_id, name, name.rsplit(".", 1)[-1]):
            crashed.append(step_id)
            raise SimulatedCrash(step_id)
        if previous is not None:  # an enclosing crash_after's
            previous(ctx, step_id, name)

    runner.fault = fault
    try:
        yield
    finally:
        runner.fault = previous
    if not crashed:
        raise AssertionError(f"crash_after({wanted!r}): no such step ran in the block")


def _horizon(until):
    if until is None:
        return None
    if isinstance(until, datetime.datetime):
        return clock.aware(until, "until")
    return clock.due_time(delay=until)


@contextlib.contextmanager
def _in_this_transaction():
    """Run workflows inside whatever transaction the test has open (a
    `TestCase`'s): steps refuse only atomic blocks opened beyond it."""
    depths = {db.alias: len(db.atomic_blocks) for db in connections.all(initialized_only=True)}
    if not registry.names():
        raise EverystepError(
            "no workflows are registered: import the module that defines them "
            "(the EVERYSTEP_WORKFLOWS setting, or an app's workflows module)"
        )
    with context.hosting(context.HostTransaction(depths)):
        yield


@contextlib.contextmanager
def _clock_that_jumps():
    """The engine's clock, which `jump_to(moment)` moves ahead (never back)
    for the rest of the block."""
    previous = clock.override
    ahead = datetime.timedelta(0)

    def now():
        moment = previous() if previous is not None else datetime.datetime.now(datetime.UTC)
        return moment + ahead

    def jump_to(moment):
        nonlocal ahead
        ahead += max(datetime.timedelta(0), moment - now())

    clock.override = now
    try:
        yield jump_to
    finally:
        clock.override = previous
