"""What a user writes: an :class:`Inbox` with one handler per event type.

    inbox = Inbox("payments")

    @inbox.handler(OrderPlaced)
    async def charge(event: OrderPlaced, tx: psycopg.AsyncConnection) -> None:
        await tx.execute("INSERT INTO charges …", (event.order_id, event.total))

``tx`` is the open transaction in which the inbox records the event id: the handler's writes
commit together with it, exactly once per event id. Handlers say nothing about dedupe.

A *batch handler* takes several events of its type at once, in the same transaction, so that
it can write them in one command (an ``insert_many``, an ``executemany``)::

    @inbox.batch_handler(PaymentReceived)
    async def record(events: Sequence[PaymentReceived], tx: AsyncClientSession) -> None:
        await tx.client.shop.payments.insert_many([{...} for e in events], session=tx)

It gets the new events (never a duplicate) of a run of consecutive records of its type, in
their order; an event of another type between them starts another call, so the order of a
key's events is kept across types. Any number of events, one included: when it raises, the
inbox redoes those events one by one to find the one that fails (docs/inbox.md).

The transaction's type is the backend's: a psycopg ``AsyncConnection`` on PostgreSQL (the
default), a pymongo ``AsyncClientSession`` on MongoDB — ``Inbox[AsyncClientSession]("payments")``
— so that ``mypy`` rejects a handler written for the other database::

    inbox = Inbox[AsyncClientSession]("payments")

    @inbox.handler(OrderPlaced)
    async def charge(event: OrderPlaced, tx: AsyncClientSession) -> None:
        await tx.client.shop.charges.insert_one({...}, session=tx)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic

from typing_extensions import TypeVar

from outboxkit.core import tracing
from outboxkit.inbox.exceptions import HandlerRegistrationError
from outboxkit.schemas import Event, EventRegistry

if TYPE_CHECKING:
    import psycopg

E = TypeVar("E", bound=Event)

#: The transaction a handler runs in (the database backend's own type). The default is named, not
#: imported: the engine loads no database driver (tests/unit/test_lazy_backends.py).
TX = TypeVar("TX", default="psycopg.AsyncConnection[Any]")

Handler = Callable[[Any, TX], Awaitable[None]]
#: A handler of several events at once (:meth:`Inbox.batch_handler`).
BatchHandler = Callable[[Sequence[Any], TX], Awaitable[None]]


class Inbox(Generic[TX]):
    """Handlers of one inbox, named ``name`` (group ``outboxkit.inbox.<name>``; the dedupe key
    is (name, event id)), each run in a transaction of type ``TX``."""

    def __init__(self, name: str, *, registry: EventRegistry | None = None) -> None:
        if not name or not all(c.isalnum() or c in "._-" for c in name):
            raise HandlerRegistrationError(f"inbox name {name!r}: use letters, digits, . _ -")
        self.name = name
        self.registry = registry or EventRegistry()
        self._handlers: dict[type[Event], Handler[TX]] = {}
        self._batch_handlers: dict[type[Event], BatchHandler[TX]] = {}

    def handler(
        self, event_cls: type[E]
    ) -> Callable[[Callable[[E, TX], Awaitable[None]]], Callable[[E, TX], Awaitable[None]]]:
        """Register the decorated coroutine for ``event_cls`` (and the class in the registry)."""
        self._check_new(event_cls)

        def register(
            func: Callable[[E, TX], Awaitable[None]],
        ) -> Callable[[E, TX], Awaitable[None]]:
            self._register(event_cls)
            self._handlers[event_cls] = func
            return func

        return register

    def batch_handler(
        self, event_cls: type[E]
    ) -> Callable[
        [Callable[[Sequence[E], TX], Awaitable[None]]],
        Callable[[Sequence[E], TX], Awaitable[None]],
    ]:
        """Register the decorated coroutine for ``event_cls``, called with several new events of
        that type at once, in one transaction (see the module's text)."""
        self._check_new(event_cls)

        def register(
            func: Callable[[Sequence[E], TX], Awaitable[None]],
        ) -> Callable[[Sequence[E], TX], Awaitable[None]]:
            self._register(event_cls)
            self._batch_handlers[event_cls] = func
            self._handlers[event_cls] = _one_at_a_time(func)
            return func

        return register

    def _check_new(self, event_cls: type[Event]) -> None:
        if not (isinstance(event_cls, type) and issubclass(event_cls, Event)):
            raise HandlerRegistrationError(f"{event_cls!r} is not an Event subclass")
        if event_cls in self._handlers:
            raise HandlerRegistrationError(f"{event_cls.__name__} already has a handler")

    def _register(self, event_cls: type[Event]) -> None:
        if event_cls not in self.registry:
            self.registry.register(event_cls)

    def handler_for(self, event: Event) -> Handler[TX] | None:
        """The handler of ``event``'s type (a batch handler's, called with ``[event]``); when
        the process uses OpenTelemetry, wrapped in a consumer span that continues the writer's
        trace (the event's ``traceparent``)."""
        handler = self._handlers.get(type(event))
        if handler is None or not tracing.in_use():
            return handler
        return _traced(handler, self.name, event)

    def batch_handler_for(self, event: Event) -> BatchHandler[TX] | None:
        """The batch handler of ``event``'s type, if it has one; when the process uses
        OpenTelemetry, each call is a consumer span linked to its events' traces."""
        batch = self._batch_handlers.get(type(event))
        if batch is None or not tracing.in_use():
            return batch
        return _traced_batch(batch, self.name, event)

    @property
    def event_types(self) -> list[type[Event]]:
        return list(self._handlers)

    @property
    def topics(self) -> list[str]:
        """The topics of the handled event types: what this inbox consumes by default."""
        return sorted({cls.event_topic for cls in self._handlers if cls.event_topic is not None})


def _traced(handler: Handler[TX], inbox: str, event: Event) -> Handler[TX]:
    async def traced(event: Any, tx: TX) -> None:
        attributes = {**_attributes(inbox, event), "messaging.message.id": str(event.id)}
        with tracing.consumer_span(f"{event.topic} process", event.headers, attributes):
            await handler(event, tx)

    return traced


def _one_at_a_time(batch: BatchHandler[TX]) -> Handler[TX]:
    async def one(event: Any, tx: TX) -> None:
        await batch([event], tx)

    return one


def _traced_batch(batch: BatchHandler[TX], inbox: str, event: Event) -> BatchHandler[TX]:
    async def traced(events: Sequence[Any], tx: TX) -> None:
        attributes = {**_attributes(inbox, event), "messaging.batch.message_count": len(events)}
        with tracing.consumer_batch_span(
            f"{event.topic} process", [e.headers for e in events], attributes
        ):
            await batch(events, tx)

    return traced


def _attributes(inbox: str, event: Event) -> dict[str, str | int]:
    """The consumer span's attributes that every event of ``event``'s type shares."""
    return {
        "messaging.system": "kafka",
        "messaging.operation.type": "process",
        "messaging.destination.name": event.topic,
        "messaging.consumer.group.name": f"outboxkit.inbox.{inbox}",
        "outboxkit.event_type": event.event_type,
    }
