"""Pickup latency: how long a run waits for an idle worker.

One worker process (``--poll 0.2``, the default; pool and everything else
the defaults) idles. The probe schedules a run with ``schedule()`` in
autocommit mode — committed when it returns, when the clock is read — and
the run's first step records ``time.time()`` as it starts; the difference
is the pickup latency (same machine, same wall clock). The step also sends
its time to the probe as a UDP datagram on 127.0.0.1, so the probe waits
without querying the database (which would load the machine under test);
the run's completion is then checked before the next sample, so every
sample meets an idle worker. Schedules are spaced by a random pause of up
to one poll interval (seeded), so that they land at every point of the
worker's poll cycle rather than in step with it. A few warm-up samples are
dropped; p50 and p99 are taken over the rest.

With ``notify`` false the worker is started with ``--no-notify`` (polling
only); otherwise it does whatever the engine does by default on this
database (on PostgreSQL, a LISTEN/NOTIFY wake-up).

With ``delay`` (seconds), each probe run is scheduled to start that much
later (``schedule(..., delay=...)``, plus the same random part of a poll),
and its latency runs from its due time (``run_at``) instead of its commit:
how fast a run that falls due is picked up.

With ``wake``, the latency is a parked run's wake-up (§15). ``message``:
the probe run waits in a ``receive()``; once it is parked, the probe sends
it a message (autocommit), and the latency runs from that commit to the
start of the step after the receive. ``result``: the probe run waits for
its child's result, the child for a message; the probe sends the child its
message, and the latency runs from the child's end (``completed_at``) to
the start of the parent's next step.

With ``floor``, no worker runs: the figures are the floor under a pickup on
this machine and server, a NOTIFY's commit to a claim's reply through the
raw driver (`bench.pickup_floor`), sampled the same way.
"""

import os
import random
import socket
import time
from collections.abc import Callable
from typing import NamedTuple

from bench import pickup_floor, workflows
from bench.common import Workers, percentile, wait_for
from everystep import schedule, send
from everystep.models import Workflow

WARM_UP = 10
TIMEOUT = 30  # seconds a sample may take to start


class Sample(NamedTuple):
    """A sample under way: the sender its datagram names, a function of the
    moment its latency runs from (called once it has started), and one that
    waits until it is done with."""

    sender: object
    since: Callable[[], float]
    done: Callable[[], None] = lambda: None


def receive_start(probe, sender):
    """The start time `sender` (a probe run's or row's id) sends; others
    are ignored."""
    deadline = time.monotonic() + TIMEOUT
    while (remaining := deadline - time.monotonic()) > 0:
        probe.settimeout(remaining)
        try:
            message = probe.recv(200).decode()
        except TimeoutError:
            break
        name, _, started = message.partition(" ")
        if name == str(sender):
            return float(started)
    raise TimeoutError(f"sample {sender} did not start within {TIMEOUT}s")


def at_random_point(rng, poll, commit):
    """Call `commit` (which commits before it returns) at a random point of
    a poll; returns what it returned and the time it returned."""
    time.sleep(rng.uniform(0, poll))
    result = commit()
    return result, time.time()


def scheduled(delay, rng, poll):
    """Schedule a probe run at a random point of the worker's poll (due
    `delay` seconds later, if given, from when its latency runs)."""
    if delay is None:
        run, committed = at_random_point(rng, poll, lambda: schedule(workflows.pickup_probe))
    else:
        run = schedule(workflows.pickup_probe, delay=delay + rng.uniform(0, poll))
        committed = run.run_at.timestamp()  # from when it is due
    return Sample(run.id, lambda: committed, lambda: wait_completed(run.id))


def parked(run_id):
    return Workflow.objects.filter(id=run_id, status="scheduled", run_at__year=9999).exists()


def wait_parked(run_id):
    wait_for(lambda: parked(run_id), TIMEOUT, "the probe run to park", interval=0.005)


def wait_completed(run_id):
    """Wait until the run `run_id` completed, so the next sample meets an
    idle worker."""
    wait_for(
        lambda: Workflow.objects.filter(id=run_id, status="completed").exists(),
        TIMEOUT,
        "the probe run to complete",
        interval=0.005,
    )


def woken(wake, rng, poll):
    """Schedule a probe run that parks (`wake`: ``message`` or ``result``),
    and wake it at a random point of the worker's poll."""
    probe = workflows.wake_probe if wake == "message" else workflows.result_probe
    run = schedule(probe)
    wait_parked(run.id)
    target = run.id
    if wake == "result":
        wait_for(lambda: Workflow.objects.filter(parent_id=run.id).exists(), TIMEOUT, "the child")
        target = Workflow.objects.get(parent_id=run.id).id
        wait_parked(target)
    _, sent = at_random_point(rng, poll, lambda: send(target, "go"))

    def since():
        """The message's commit, or the child's end (read once it ended)."""
        if wake == "message":
            return sent
        return Workflow.objects.get(id=target).completed_at.timestamp()

    return Sample(run.id, since, lambda: wait_completed(run.id))


def floor_sample(listener, rng, poll):
    """A row scheduled for the floor's listener at a random point of a poll."""
    row, committed = at_random_point(rng, poll, listener.schedule)
    return Sample(row, lambda: committed)


def measure(
    samples=200, poll=0.2, notify=True, log_dir=".", seed=1, delay=None, wake=None, floor=False
):
    """The pickup's figures, in ms; with `floor`, no worker: the floor under
    a pickup, a NOTIFY's commit to a claim's reply (`bench.pickup_floor`)."""
    rng = random.Random(seed)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
        if floor:
            with pickup_floor.Listener(address, log_dir) as listener:
                delays = take(samples, probe, lambda: floor_sample(listener, rng, poll))
        else:
            flags = ["--poll", str(poll)] + ([] if notify else ["--no-notify"])
            url = os.environ["EVERYSTEP_DATABASE_URL"]
            env = {workflows.PROBE_ADDRESS: address}
            with Workers(1, flags, url, log_dir, prefix="bench-pickup", env=env) as group:
                group.wait_ready()
                if wake is None:
                    delays = take(samples, probe, lambda: scheduled(delay, rng, poll))
                else:
                    delays = take(samples, probe, lambda: woken(wake, rng, poll))
    return {
        "samples": samples,
        "pickup_p50_ms": percentile(delays, 0.5) * 1e3,
        "pickup_p99_ms": percentile(delays, 0.99) * 1e3,
        "pickup_min_ms": min(delays) * 1e3,
        "pickup_max_ms": max(delays) * 1e3,
    }


def take(samples, probe, start):
    """`samples` latencies (seconds), after `WARM_UP` dropped: each `start()`s
    a `Sample`, whose start time comes to `probe`."""
    delays = [latency(probe, start()) for _ in range(WARM_UP + samples)]
    return delays[WARM_UP:]


def latency(probe, sample):
    """Seconds from `sample`'s moment to its start (sent to `probe`), once
    it is done with."""
    started = receive_start(probe, sample.sender)
    began = sample.since()
    sample.done()
    return started - began
