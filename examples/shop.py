"""An order pipeline, the example workflows of the README and `make run`.

`fulfil_order` reserves stock, charges the card exactly once (an
unsafe-to-repeat step: if a crash loses its outcome, the run is blocked for
an operator instead of charging twice), then notifies the warehouse and the
customer in parallel. An order for an item out of stock stops the run
deliberately with `Terminal`: a business outcome, not a failure.

Run it with the zipapp::

    export EVERYSTEP_PATH=examples EVERYSTEP_WORKFLOWS=shop
    ./everystep.pyz schedule fulfil_order '{"id": 7, "item": "lamp", "quantity": 1, "card": "tok"}'
    ./everystep.pyz worker
"""

import hashlib
import logging
import time

from everystep import Terminal, parallel, step, workflow

logger = logging.getLogger("everystep.examples.shop")

STOCK = {"lamp": 10, "chair": 4, "desk": 0}
PRICES = {"lamp": 49_00, "chair": 120_00, "desk": 340_00}


@step
def reserve_stock(item, quantity):
    """Reserve the items, or stop the order if there are not enough."""
    time.sleep(0.05)  # a call to the inventory service
    if STOCK.get(item, 0) < quantity:
        raise Terminal("out of stock", {"item": item, "wanted": quantity})
    return {"item": item, "quantity": quantity, "reservation": f"R-{item}-{quantity}"}


@step(unsafe_to_repeat=True)
def charge_card(card, amount_cents):
    """Charge the customer. Never repeated: a lost outcome blocks the run."""
    time.sleep(0.1)  # the payment provider
    charge_id = "ch_" + hashlib.sha256(f"{card}:{amount_cents}".encode()).hexdigest()[:12]
    logger.info("charged %s cents with %s", amount_cents, charge_id)
    return {"charge": charge_id, "amount": amount_cents}


@step
def notify_warehouse(reservation):
    time.sleep(0.05)
    return f"picking list sent for {reservation}"


@step
def email_customer(order_id, charge):
    time.sleep(0.05)
    return f"receipt for order {order_id} ({charge})"


@workflow
def fulfil_order(order):
    """Reserve, charge, then notify warehouse and customer at once."""
    reservation = reserve_stock(order["item"], order["quantity"])
    amount = PRICES[order["item"]] * order["quantity"]
    payment = charge_card(order["card"], amount)
    picking, receipt = parallel(
        lambda: notify_warehouse(reservation["reservation"]),
        lambda: email_customer(order["id"], payment["charge"], everystep_id="receipt"),
    )
    return {
        "order": order["id"],
        "charge": payment["charge"],
        "picking": picking,
        "receipt": receipt,
    }
