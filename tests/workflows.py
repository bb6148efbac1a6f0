"""Workflows the tests run, in a module of their own so that worker
subprocesses can import them too (``EVERYSTEP_WORKFLOWS=tests.workflows``).

`calls` counts how often each step function really executed, so that tests
can tell a replayed step (served from the record) from an executed one.
"""

import collections
import datetime
import enum
import threading
import uuid

import everystep
from everystep import Terminal, parallel, step, workflow
from everystep.engine import context

calls = collections.Counter()
_calls_lock = threading.Lock()


def count(name):
    with _calls_lock:
        calls[name] += 1


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Priority(enum.IntEnum):
    LOW = 1
    HIGH = 2


class CustomError(Exception):
    pass


class UnbuildableError(Exception):
    """An exception whose constructor cannot be called from its stored args."""

    def __init__(self, code, detail):
        super().__init__(f"{code}: {detail}")


@step
def add(a, b):
    count("add")
    return a + b


@step
def echo(value):
    count("echo")
    return value


@step
def fail(message):
    count("fail")
    raise CustomError(message)


@step
def fail_unbuildable():
    count("fail_unbuildable")
    raise UnbuildableError(7, "out of order")


@step
def identify(tag):
    """Return which run and scope this step ran in, as its context says."""
    ctx = context.current()
    return [str(ctx.workflow_id), ctx.prefix, tag]


@step
def stop_here(reason):
    count("stop_here")
    raise Terminal(reason, {"why": reason})


@step(unsafe_to_repeat=True)
def charge(amount):
    count("charge")
    return {"charged": amount}


@step
def not_serializable():
    count("not_serializable")
    return object()


@workflow
def add_twice(a, b):
    return add(add(a, b), b)


@workflow
def named_and_positional():
    first = echo("one")
    named = echo("two", everystep_id="middle")
    second = echo("three")
    return [first, named, second]


@workflow
def fork_ids():
    echo("before")
    results = parallel(lambda: echo("b0"), [lambda: echo("b1-1"), lambda: echo("b1-2")])
    parallel(lambda: echo("x"), lambda: echo("y", everystep_id="attach"), everystep_id="fanout")
    echo("after")
    return results


@workflow
def nested_forks(n):
    """A fork inside a fork, sequence branches and a named step: the step
    graph's hardest straight-line case."""
    first = echo(n)
    parallel(
        lambda: parallel(lambda: echo("a"), [lambda: echo("b"), lambda: add(1, 2)]),
        [lambda: echo("c"), lambda: echo("d", everystep_id="named")],
    )
    return add(first, len("x"))


@workflow
def calls_a_helper(n):
    return doubled_by_a_helper(n)


def doubled_by_a_helper(n):
    return add(n, n)


@workflow
def echo_values(*values):
    return [echo(value) for value in values]


@workflow
def with_cleanup():
    try:
        fail("boom")
    except CustomError as exc:
        echo(f"cleaned up after {exc}")
        return "recovered"


@workflow
def failing_body():
    echo("first")
    raise CustomError("the body itself failed")


@workflow
def unbuildable_failure():
    try:
        fail_unbuildable()
    except Exception as exc:
        return [type(exc).__name__, str(exc)]


@workflow
def stop_in_body():
    echo("first")
    raise Terminal("not today", {"retry": False})


@workflow
def stop_in_branch():
    parallel(lambda: echo("healthy"), lambda: stop_here("branch says stop"))
    echo("never")


@workflow
def one_branch_fails():
    parallel(lambda: echo("healthy"), lambda: fail("one"))


@workflow
def two_branches_fail():
    parallel(lambda: fail("left"), lambda: echo("healthy"), lambda: fail("right"))


@workflow
def pay(amount):
    receipt = charge(amount)
    echo("receipt sent")
    return receipt


@workflow
def returns_unserializable():
    return object()


@workflow
def calls_unserializable_step():
    not_serializable()


@workflow
def typed_values(value):
    return echo(value)


@workflow
def whoami(tag):
    """Record which run and scope every step saw, across a fork."""
    first = identify(tag)
    left, right = parallel(lambda: identify(tag), lambda: identify(tag))
    return [first, left, right]


SAMPLE_VALUES = [
    None,
    True,
    3,
    2.5,
    "text",
    [1, "two"],
    {"nested": {"list": [1, 2]}},
    (1, "tuple"),
    datetime.datetime(2026, 1, 2, 3, 4, 5, 678, tzinfo=datetime.UTC),
    datetime.datetime(2026, 1, 2, 3, 4, 5),
    datetime.date(2026, 1, 2),
    datetime.timedelta(days=1, seconds=2, microseconds=3),
    uuid.UUID("12345678-1234-5678-1234-567812345678"),
    b"\x00bytes\xff",
    bytearray(b"mutable"),
    Color.BLUE,
    Priority.HIGH,
    {"__es__": "not a tag", "v": 1},
]


@step
def gate(directory, label):
    """Mark `label` started (a mark appended to a file), then wait until the
    test opens its gate (another file). Returns how many times this gate has
    been passed."""
    import pathlib
    import time

    directory = pathlib.Path(directory)
    with (directory / f"{label}.started").open("a") as marks:
        marks.write("x")
    count(f"gate-{label}")
    deadline = time.monotonic() + 120
    while not (directory / f"{label}.go").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {label} never opened")
        time.sleep(0.01)
    passed = directory / f"{label}.passed"
    with passed.open("a") as marks:
        marks.write("x")
    return len(passed.read_text())


@workflow
def gated(directory):
    """Two steps, each held at a gate the test opens."""
    return [gate(directory, "first"), gate(directory, "second")]


@workflow
def held(directory, label):
    """One step held at the gate `label` the test opens."""
    return gate(directory, label)


@step(unsafe_to_repeat=True)
def charge_at_gate(directory):
    """An unsafe step held at the gate ``charge``: a run interrupted in it
    is blocked, never charged twice."""
    return gate(directory, "charge")


@workflow
def gated_charge(directory):
    return charge_at_gate(directory)


@step
def nap(seconds):
    import time

    time.sleep(seconds)
    return seconds


@workflow
def quick(n):
    """Two trivial steps: the claim and recording tests' workload."""
    return add(n, echo(n))


@workflow
def napping(seconds, steps):
    """`steps` steps that each sleep `seconds`: keeps runs in flight."""
    return [nap(seconds) for _ in range(steps)]


@workflow
def fanned(n):
    """A fork of three branches: each branch thread opens its own connection."""
    return parallel(lambda: echo(n), lambda: echo(n + 1), lambda: add(n, n))


@step
def inner(tag):
    count("inner")
    return f"inner:{tag}"


@step
def outer(tag):
    """A step whose function calls another step: a plain call."""
    count("outer")
    return f"outer:{inner(tag)}"


@workflow
def step_calls_step():
    return [outer("from-outer"), inner("from-body")]


@step
def fans_out_inside(n):
    """A step whose function forks and reads the run's context."""
    ctx = context.current()
    left, right = parallel(lambda: inner(n), lambda: str(context.current().workflow_id))
    return [str(ctx.workflow_id), left, right]


@workflow
def step_forks_inside():
    return [fans_out_inside("x"), echo("after")]


@workflow
def charges_inside_atomic(amount):
    from django.db import transaction

    with transaction.atomic():
        return charge(amount)


@workflow
def charges_with_autocommit_off(amount):
    """Turns autocommit off, as code that manages its own transactions
    does, and calls an unsafe step in the transaction that opens."""
    from django.db import transaction

    transaction.set_autocommit(False)
    return charge(amount)


@step
def leaves_autocommit_off(value):
    from django.db import transaction

    transaction.set_autocommit(False)
    return value


@workflow
def step_leaves_autocommit_off(amount):
    leaves_autocommit_off("left open")
    return charge(amount)


@workflow
def forks_inside_atomic():
    from django.db import transaction

    with transaction.atomic():
        return parallel(lambda: echo("left"), lambda: echo("right"))


@step
def sized(length):
    count("sized")
    return "x" * length


@workflow
def large_outcome(length):
    return len(sized(length))


@step
def from_codes(codes):
    return "".join(map(chr, codes))


@workflow
def text_from_codes(codes):
    return from_codes(codes)


@step
def counted(tag):
    """A step that counts its executions under `tag`."""
    count(tag)
    return tag


@workflow
def sleeper(seconds):
    """A step, a durable sleep of `seconds`, another step."""
    before = counted("before")
    everystep.sleep(seconds)
    return [before, counted("after")]


@workflow
def named_sleeper(seconds):
    """A named sleep between two positional steps (ids 1, nap, 2)."""
    everystep.sleep(seconds, everystep_id="nap")
    return [counted("one"), counted("two")]


@workflow
def sleeps_in_a_branch(seconds):
    """A fork whose second branch sleeps: the run leaves once the fork ends."""
    return parallel(lambda: counted("left"), [lambda: everystep.sleep(seconds), lambda: "woke"])


@step
def sleeps_inside(seconds):
    """A step whose function sleeps: a plain time.sleep, nothing recorded."""
    everystep.sleep(seconds)
    return "slept"


@workflow
def sleeps_inside_a_step(seconds):
    return sleeps_inside(seconds)


class Flaky(ConnectionError):
    """What a flaky step raises: a transient error its policy retries."""


def _fails_first(tag, failures):
    count(tag)
    if calls[tag] <= failures:
        raise Flaky(f"{tag}: call {calls[tag]} failed")
    return calls[tag]


@step(retries=3, backoff=0.01, max_backoff=0.02, retry_on=Flaky)
def flaky(tag, failures):
    """Fails its first `failures` calls, then returns how many calls it took."""
    return _fails_first(tag, failures)


@step(retries=2, backoff=30, max_backoff=60)
def flaky_slow(tag, failures):
    """As `flaky`, with waits long enough to be durable."""
    return _fails_first(tag, failures)


@step(unsafe_to_repeat=True, retries=2, backoff=0.01, max_backoff=0.01)
def flaky_charge(tag, failures):
    """An unsafe step that fails its first `failures` calls (its outcome
    known each time), then charges."""
    return _fails_first(tag, failures)


@step(retries=3, backoff=0.01, retry_on=Flaky)
def wrong_error(tag):
    count(tag)
    raise ValueError("not a transient error")


@step(retries=3, backoff=0.01)
def gives_up(tag):
    count(tag)
    raise Terminal("no point retrying")


@workflow
def retried(failures):
    return flaky("flaky", failures)


@workflow
def retried_durably(failures):
    return [counted("before"), flaky_slow("slow", failures)]


@workflow
def retried_unsafe(failures):
    return flaky_charge("charge", failures)


@workflow
def not_retried(kind):
    return wrong_error("wrong") if kind == "wrong" else gives_up("terminal")


@step
def cancel_my_run():
    """Asks to cancel the run it belongs to, and finishes all the same."""
    everystep.cancel(context.current().workflow_id, reason="changed my mind")
    return "asked"


@workflow
def cancels_itself():
    cancel_my_run()
    return counted("after-cancel")


@step
def fails_on_the_first_call(tag):
    count(tag)
    if calls[tag] == 1:
        raise CustomError(f"{tag} failed the first time")
    return tag


@workflow
def fails_once_after_a_step():
    return [counted("one"), fails_on_the_first_call("two")]


@workflow
def gated_sleeper(directory, seconds):
    """A gate, a durable sleep, another gate: the gates' files count the
    calls across processes."""
    first = gate(directory, "before")
    everystep.sleep(seconds)
    return [first, gate(directory, "after")]


@step(retries=2, backoff=3, max_backoff=3)
def fails_first_call(directory):
    """Counts its calls in a file; the first one fails. Its retry waits
    1.5 to 3 s: durably, the run leaving its worker."""
    import pathlib

    marks = pathlib.Path(directory) / "calls"
    with marks.open("a") as file:
        file.write("x")
    if len(marks.read_text()) == 1:
        raise Flaky("the first call fails")
    return len(marks.read_text())


@workflow
def retried_across_workers(directory):
    return fails_first_call(directory)


@workflow
def sleeps_while_a_branch_cancels():
    """Branch 0 goes to sleep; branch 1's step cancels the run."""
    return parallel(lambda: everystep.sleep(3600), cancel_my_run)


@step
def insert_twice(key):
    """Two rows with one idempotency key: the second fails on the unique
    constraint, a database error inside the step."""
    from everystep.models import Workflow

    Workflow.objects.create(name="tests.workflows.quick", idempotency_key=key)
    Workflow.objects.create(name="tests.workflows.quick", idempotency_key=key)


@workflow
def inserts_twice(key):
    insert_twice(key)


@step
def journal(path, key):
    """Append `key` to the file `path`, one line per execution: a test
    process counts there what worker processes executed."""
    with open(path, "a") as lines:
        lines.write(f"{key}\n")
    return key


@workflow
def journaled(path, n, steps):
    """`steps` journaled steps: each execution of each leaves one line."""
    return [journal(path, f"{n}:{i}") for i in range(steps)]


# What a worker's start loads (Django, the drivers, everystep) is tens of
# thousands of objects: more than this many are frozen once it has started.
FROZEN_AT_THE_START = 20_000


@step
def garbage_collector():
    """The garbage collector's state in the process that runs this step."""
    import gc

    return {"enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}


@workflow
def collector_state():
    return garbage_collector()
