"""The flow-control benchmark's queues and workflows, in a module of their
own: a limited queue's row makes every claim lock it, which the other
sections must not measure (``BENCH_WORKFLOWS=bench.workflows,bench.flow_workflows``)."""

import time

from everystep import Queue, step, workflow

LIMITED = Queue("bench_limited", concurrency=8)
RATED = Queue("bench_rated", rate=(20, 1.0))


@step
def hold(seconds):
    time.sleep(seconds)


@workflow(queue="bench_limited")
def limited(seconds):
    hold(seconds)


@workflow(queue="bench_rated")
def rated():
    hold(0.0)
