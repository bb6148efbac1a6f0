"""Workflows in limited queues, for the flow-control tests: each run holds
one step for a while, and the steps' recorded start and end times show how
many ran at once (``EVERYSTEP_TEST_WORKFLOWS=tests.workflows,tests.queue_workflows``)."""

import time

from everystep import Queue, step, workflow

TIGHT = Queue("tight", concurrency=3)
PER_CUSTOMER = Queue("per_customer", key_concurrency=1)
METERED = Queue("metered", rate=(4, 2.0))


@step
def hold(seconds):
    time.sleep(seconds)
    return seconds


@workflow(queue="tight")
def tight(seconds):
    return hold(seconds)


@workflow(queue="per_customer")
def per_customer(seconds):
    return hold(seconds)


@workflow(queue="metered")
def metered():
    return hold(0.0)


@workflow(queue="reports", priority=5)
def report(seconds):
    return hold(seconds)


@workflow
def anywhere(seconds):
    return hold(seconds)
