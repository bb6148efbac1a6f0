"""A checkout that waits for the payment provider's confirmation, the
example of the README's "Approvals, webhooks and child workflows".

The order is reserved, then the run waits — parked, holding no worker — for
a message on ``payment``: the provider's webhook sends it. With no
confirmation in 30 minutes the reservation is released and the order
cancelled. A paid order starts a child run that makes its invoice, and
returns once the child has.

Run it with the zipapp::

    export EVERYSTEP_PATH=examples EVERYSTEP_WORKFLOWS=checkout
    ./everystep.pyz schedule checkout 7          # prints the run id
    ./everystep.pyz worker &
    ./everystep.pyz runs --waiting              # the run waits for a message on payment
    ./everystep.pyz send RUN_ID payment '{"amount": 4900}'
"""

import json

from everystep import receive, send, start, step, workflow

RESERVED = set()


@step
def reserve(order_id):
    RESERVED.add(order_id)
    return f"R-{order_id}"


@step
def release(order_id):
    RESERVED.discard(order_id)


@step
def render_invoice(order_id, amount):
    return f"INV-{order_id}-{amount}"


@workflow
def make_invoice(order_id, amount):
    return render_invoice(order_id, amount)


@workflow
def checkout(order_id):
    reserve(order_id)
    payment = receive("payment", timeout=30 * 60)  # parked until it comes, 30 min at most
    if payment is None:
        release(order_id)  # no confirmation in time: cancel the order
        return "cancelled"
    invoice = start(make_invoice, order_id, payment["amount"])  # a child run
    return {"paid": payment["amount"], "invoice": invoice.result()}  # parked until it ends


def payment_webhook(request):
    """The payment provider's webhook, as a Django view."""
    from django.http import HttpResponse

    event = json.loads(request.body)
    send(
        event["order_run"],
        "payment",
        {"amount": event["amount"]},
        idempotency_key=event["id"],  # a redelivered webhook is stored once
    )
    return HttpResponse(status=204)
