"""The orders service's tasks: plain Celery tasks, with a failure policy in a few options.

Nothing here calls celery_dlx except the options (``dlx_requeue_on``, ``dlx_park_on``,
``dlx_bury_on``, ``dlx_importance``): a failure is an ordinary exception, and celery_dlx turns it
into a fate (requeued at the tail, parked in Redis, or buried in the graveyard).
"""

from __future__ import annotations

from typing import Any

from .app import REDIS_URL, RUN, app
from .world import Database, Gateway, client

_redis = client(REDIS_URL)
gateway = Gateway(_redis, RUN)
database = Database(_redis, RUN)


class PaymentTimeout(TimeoutError):
    """The payment gateway did not answer in time: worth another try right away."""


class CardDeclined(Exception):
    """The card was refused: no retry will change that."""


class InvalidOrder(ValueError):
    """The order message lacks what an order needs: a bug upstream, not a passing fault."""


class OrderNotFound(LookupError):
    """The order's row is not there yet: the service writing it commits a little later."""


#: Fields an imported order must have.
REQUIRED = ("order_id", "customer", "amount_cents", "currency")


@app.task(
    name="orders.charge",
    # A timeout is retried at the tail of the queue (two requeues, then parks); a refusal is
    # buried at once. Payments page someone when they are buried.
    dlx_requeue_on=(PaymentTimeout,),
    dlx_bury_on=(CardDeclined,),
    dlx_importance="page",
)
def charge(order_id: str, amount_cents: int) -> str:
    """Charge an order through the payment gateway."""
    answer = gateway.next_answer(order_id)
    if answer == "timeout":
        raise PaymentTimeout(f"payment gateway did not answer within 2s for order {order_id}")
    if answer == "decline":
        raise CardDeclined(f"card declined for order {order_id} ({amount_cents} cents)")
    database.update(order_id, paid=amount_cents)
    return f"charged {order_id}"


@app.task(
    name="orders.ship",
    # A missing row is expected for a moment: park (1 s, 2 s, 4 s), no requeues.
    dlx_park_on=(OrderNotFound,),
)
def ship(order_id: str) -> str:
    """Book the shipment of an order; its row must be committed first."""
    row = database.get(order_id)
    if row is None:
        raise OrderNotFound(f"order {order_id} is not in the orders table yet")
    database.update(order_id, shipped=True)
    return f"shipped {order_id}"


@app.task(name="orders.import_order", dlx_bury_on=(InvalidOrder,))
def import_order(payload: dict[str, Any]) -> str:
    """Import an order sent by the web shop."""
    missing = [name for name in REQUIRED if name not in payload]
    if missing:
        raise InvalidOrder(f"order payload lacks {', '.join(missing)}")
    database.insert(str(payload["order_id"]), dict(payload))
    return f"imported {payload['order_id']}"
