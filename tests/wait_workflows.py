"""Workflows that wait for the world (§15): messages, events, child runs
and results (``EVERYSTEP_TEST_WORKFLOWS=tests.workflows,tests.wait_workflows``
for a worker subprocess)."""

import time

from everystep import (
    Terminal,
    get_event,
    parallel,
    receive,
    result,
    send,
    set_event,
    start,
    step,
    workflow,
)

#: Calls of the steps below in this process, by step name.
CALLS = {}


@step
def note(value):
    CALLS["note"] = CALLS.get("note", 0) + 1
    return value


@step
def hold(seconds):
    time.sleep(seconds)
    return seconds


@workflow
def awaits_payment(order_id, timeout=None):
    """An order waiting for its payment's confirmation, cancelled when none
    comes in time."""
    payment = receive("payment", timeout=timeout)
    if payment is None:
        return {"order": order_id, "status": "cancelled: no payment in time"}
    return {"order": order_id, "paid": note(payment)}


@workflow
def receives(topic, count, timeout=None):
    return [receive(topic, timeout=timeout) for _ in range(count)]


@workflow
def receives_in_branches(count):
    return parallel(*[lambda: receive("item") for _ in range(count)])


@workflow
def sends(run_id, topic, payload):
    send(run_id, topic, payload)
    return note("sent")


@workflow
def publishes(count):
    for value in range(count):
        set_event("progress", value)
    return note("published")


@workflow
def reads_event(run_id):
    return get_event(run_id, "progress")


@workflow
def doubles(value):
    return note(value * 2)


@workflow
def fails(message):
    raise ValueError(message)


@workflow
def stops(reason):
    raise Terminal(reason)


@workflow
def waits_for_go():
    return receive("go")


@workflow
def holds(seconds):
    return hold(seconds)


@workflow
def parent(value):
    child = start(doubles, value)
    return [str(child.run_id), note(child.result())]


@workflow
def parent_of_failure(message):
    child = start(fails, message)
    try:
        child.result()
    except ValueError as exc:
        return f"caught {exc}"
    return "no error"


@workflow
def parent_of(child_workflow, args, timeout=None):
    """Start `child_workflow` (its registered name) with `args` and return
    its result, or what it raised, as text."""
    from everystep.core import registry

    child = start(registry.get(child_workflow), *args)
    try:
        return ["result", child.result(timeout=timeout)]
    except TimeoutError:
        return ["timeout", str(child.run_id)]
    except Terminal as exc:
        return ["terminal", str(exc)]


@workflow
def waits_for(run_id):
    return result(run_id)
