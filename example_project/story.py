"""What the demo publishes: good orders, flaky payments, a late row, poison, and foreign events.

Every message is tracked by its message id (the Celery task id, or the AMQP ``message_id`` of
the raw and foreign messages) with the fate the story expects, so the demo can tell when each one
has reached its final fate and whether that fate is the expected one.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from kombu import Producer

from .schema import message_class
from .world import Database, Gateway

DONE = "done"
RECOVERED = "recovered"
BURIED = "buried"


@dataclass(frozen=True)
class Tracked:
    """One message of the story.

    Attributes:
        label: what the table calls it (order and step).
        kind: good, flaky, late row, poison, malformed, undecodable or foreign.
        message_id: its id in celery_dlx's history and graveyard.
        expect: the fate the story expects: done, recovered or buried.
        task: True for Celery task messages (they have a result state).
        note: how the story makes it fail, for the reader.
    """

    label: str
    kind: str
    message_id: str
    expect: str
    task: bool = True
    note: str = ""


def publish_orders(app: Any, gateway: Gateway, database: Database) -> list[Tracked]:
    """Send the orders service's task messages; returns them tracked."""
    charge = app.signature("orders.charge")
    ship = app.signature("orders.ship")
    import_order = app.signature("orders.import_order")
    out: list[Tracked] = []

    def send(
        sig: Any, args: tuple[Any, ...], label: str, kind: str, expect: str, note: str
    ) -> None:
        result = sig.clone(args=args).apply_async()
        out.append(Tracked(label, kind, result.id, expect, note=note))

    for order in ("A-1001", "A-1002"):
        send(charge, (order, 4200), f"{order} charge", "good", DONE, "gateway answers ok")
    database.insert("A-1003", {"order_id": "A-1003", "customer": "c-3"})
    send(ship, ("A-1003",), "A-1003 ship", "good", DONE, "row is there")
    gateway.script("A-1004", ["timeout"])
    send(charge, ("A-1004", 1999), "A-1004 charge", "flaky", RECOVERED, "1 gateway timeout")
    gateway.script("A-1005", ["timeout", "timeout"])
    send(charge, ("A-1005", 2500), "A-1005 charge", "flaky", RECOVERED, "2 gateway timeouts")
    send(ship, ("A-1006",), "A-1006 ship", "late row", RECOVERED, "row committed after a park")
    # Down for exactly the retry budget (1 run + 2 requeues + 3 parks): buried, and a replay
    # after the outage succeeds.
    gateway.script("A-1007", ["timeout"] * 6)
    send(charge, ("A-1007", 9900), "A-1007 charge", "poison", BURIED, "gateway down for a while")
    gateway.script("A-1008", ["decline"])
    send(charge, ("A-1008", 120000), "A-1008 charge", "poison", BURIED, "card declined")
    good = {"order_id": "A-1011", "customer": "c-11", "amount_cents": 700, "currency": "EUR"}
    send(import_order, (good,), "A-1011 import", "good", DONE, "complete payload")
    bad = {"order_id": "A-1012", "amount_cents": 700}
    send(import_order, (bad,), "A-1012 import", "malformed", BURIED, "payload lacks fields")
    return out


def publish_undecodable(app: Any, queue: str) -> Tracked:
    """A task message whose JSON body was cut off in transit: Celery cannot decode it."""
    message_id = f"raw-{uuid.uuid4().hex[:12]}"
    body = json.dumps([[{"order_id": "A-1013"}], {}, {}])[:17].encode()
    with app.producer_or_acquire() as producer:
        producer.publish(
            body,
            exchange="",
            routing_key=queue,
            content_type="application/json",
            content_encoding="utf-8",
            headers={"task": "orders.import_order", "id": message_id, "lang": "py"},
        )
    return Tracked(
        "A-1013 import", "undecodable", message_id, BURIED, task=False, note="body cut off"
    )


def publish_events(app: Any, queue: str) -> list[Tracked]:
    """Protobuf ``OrderPlaced`` events for the fulfilment service, published as raw AMQP."""
    order_placed = message_class()
    events = [
        ("A-1009", "AMS", DONE, "warehouse AMS exists"),
        ("A-1010", "XXX", BURIED, "warehouse XXX does not exist"),
    ]
    out = []
    with app.connection_for_write() as conn:
        producer = Producer(conn.channel())
        for order_id, warehouse, expect, note in events:
            event = order_placed(
                order_id=order_id, amount_cents=4200, currency="EUR", warehouse=warehouse
            )
            event.items.add(sku="MUG-01", quantity=2)
            message_id = f"evt-{uuid.uuid4().hex[:12]}"
            producer.publish(
                event.SerializeToString(),
                exchange="",
                routing_key=queue,
                content_type="application/x-protobuf",
                message_id=message_id,
                delivery_mode=2,
            )
            kind = "foreign" if expect == DONE else "foreign poison"
            out.append(Tracked(f"{order_id} event", kind, message_id, expect, False, note))
    return out
