"""A workflow as it was before a deploy and as it is after it, for the
tests of `everystep.patched`: the new code charges a fee before shipping.
Both are registered under one name (``tests.patch_workflows.checkout``);
a test registers the new body over the old one, as a deploy does."""

from everystep import patched, sleep, step, workflow
from everystep.core import registry

CALLS = []


@step
def ship(order):
    CALLS.append(("ship", order))
    return f"shipped {order}"


@step
def charge_fee(order):
    CALLS.append(("fee", order))
    return f"fee for {order}"


@workflow
def checkout(order):
    """The code before the deploy: ship, then wait a day for the review."""
    shipped = ship(order)
    sleep(86_400)
    return [shipped]


def checkout_with_fee(order):
    """The code after it: a fee before shipping, for runs that start now."""
    fee = charge_fee(order) if patched("fee") else None
    shipped = ship(order)
    sleep(86_400)
    return [fee, shipped]


def deploy_the_fee():
    """Register the new body over the old, as a worker on the new code has it."""
    registry.register(checkout_with_fee, name=checkout.__everystep_workflow__)


def roll_back():
    registry.register(checkout, name=checkout.__everystep_workflow__)


#: Set by a test: the bug the deploy fixes.
BROKEN = {"label": True}


@step
def label(order):
    CALLS.append(("label", order))
    if BROKEN["label"]:
        raise ValueError("the label printer's code has a bug")
    return f"label for {order}"


@workflow
def dispatch(order):
    """Ship, then print the label: broken until the fix is deployed."""
    return [ship(order), label(order)]
