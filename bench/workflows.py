"""The benchmark's workflows: trivial steps, so that what is measured is the
engine and the database, not the work."""

import time

from everystep import step, workflow


@step
def trivial(i):
    return i


@step
def started_at():
    """When the run's first step began, by the wall clock."""
    return time.time()


@workflow
def steps(count):
    for i in range(count):
        trivial(i)


@workflow
def five_steps():
    for i in range(5):
        trivial(i)


@workflow
def one_step():
    trivial(0)


@workflow
def pickup_probe():
    return started_at()
