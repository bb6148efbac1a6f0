"""The benchmark's workflows: trivial steps, so that what is measured is the
engine and the database, not the work."""

import os
import socket
import time

from everystep import receive, start, step, workflow
from everystep.engine import context

#: ``host:port`` of the pickup probe's UDP socket (see `bench.pickup`).
PROBE_ADDRESS = "BENCH_PROBE_ADDRESS"


@step
def trivial(i):
    return i


@step
def started_at():
    """When the run's first step began, by the wall clock; also sent as a
    datagram to the waiting probe, so that it need not poll the database."""
    now = time.time()
    address = os.environ.get(PROBE_ADDRESS)
    if address:
        host, port = address.rsplit(":", 1)
        message = f"{context.current().workflow_id} {now!r}".encode()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.sendto(message, (host, int(port)))
    return now


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


@workflow
def waits_for_go():
    """Parked until a message on ``go`` comes."""
    return receive("go")


@workflow
def wake_probe():
    """Parked in a receive until the probe sends; then sends the time its
    next step starts (see `bench.pickup`)."""
    receive("go")
    return started_at()


@workflow
def result_probe():
    """Parked until its child ends (the probe sends the child its ``go``);
    then sends the time its next step starts."""
    start(waits_for_go).result()
    return started_at()
