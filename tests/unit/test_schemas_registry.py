"""EventRegistry: registration, lookup, iteration and type/version resolution on decode."""

import re

import pytest

from outboxkit.schemas import (
    DecodeErrorReason,
    Event,
    EventDecodeError,
    EventRegistry,
    RegistryError,
    encode,
)


class CartCreatedV1(Event, type="carts.created", topic="carts", key_field="cart_id"):
    cart_id: str


class CartCreatedV2(Event, type="carts.created", version=2, topic="carts", key_field="cart_id"):
    cart_id: str
    currency: str


class AccountOpened(Event, type="accounts.opened", topic="accounts", key_field="account_id"):
    account_id: str


@pytest.fixture
def registry() -> EventRegistry:
    registry = EventRegistry()
    registry.register(CartCreatedV2)
    registry.register(AccountOpened)
    registry.register(CartCreatedV1)
    return registry


def test_register_works_as_a_decorator() -> None:
    registry = EventRegistry()

    @registry.register
    class Pinged(Event, topic="pings"):
        at: int

    assert registry.get("Pinged", 1) is Pinged
    assert Pinged in registry


def test_lookup(registry: EventRegistry) -> None:
    assert registry.get("carts.created", 1) is CartCreatedV1
    assert registry.get("carts.created", 2) is CartCreatedV2
    assert registry.get("carts.created", 3) is None
    assert registry.get("nope", 1) is None
    assert registry.versions("carts.created") == (1, 2)
    assert registry.versions("nope") == ()


def test_iteration_is_ordered_by_type_then_version(registry: EventRegistry) -> None:
    assert list(registry) == [AccountOpened, CartCreatedV1, CartCreatedV2]
    assert len(registry) == 3


def test_contains_checks_the_exact_class(registry: EventRegistry) -> None:
    class Impostor(Event, type="carts.created", topic="carts"):
        cart_id: str

    assert CartCreatedV1 in registry
    assert Impostor not in registry
    assert "carts.created" not in registry


def test_registering_the_same_class_twice_is_harmless(registry: EventRegistry) -> None:
    assert registry.register(CartCreatedV1) is CartCreatedV1
    assert len(registry) == 3


def test_another_class_under_a_taken_type_and_version_is_refused(registry: EventRegistry) -> None:
    class CartCreatedClash(Event, type="carts.created", version=2, topic="carts"):
        cart_id: str

    with pytest.raises(RegistryError, match=r"'carts\.created' version 2 is already registered to"):
        registry.register(CartCreatedClash)
    assert registry.get("carts.created", 2) is CartCreatedV2


@pytest.mark.parametrize("candidate", [Event, int, "carts.created", None])
def test_only_event_subclasses_can_be_registered(candidate: object) -> None:
    with pytest.raises(RegistryError):
        EventRegistry().register(candidate)  # type: ignore[arg-type]


def test_decode_picks_the_model_by_type_and_version(registry: EventRegistry) -> None:
    for event in (CartCreatedV1(cart_id="c1"), CartCreatedV2(cart_id="c1", currency="EUR")):
        record = encode(event, source="/carts")
        decoded = registry.decode(
            topic=record.topic, key=record.key, value=record.value, headers=record.headers
        )
        assert type(decoded) is type(event)
        assert decoded == event


def test_unknown_type(registry: EventRegistry) -> None:
    record = encode(CartCreatedV1(cart_id="c1"), source="/carts")
    with pytest.raises(EventDecodeError) as caught:
        EventRegistry().decode(
            topic=record.topic, key=record.key, value=record.value, headers=record.headers
        )
    assert caught.value.reason is DecodeErrorReason.UNKNOWN_TYPE
    assert "event type 'carts.created' is not registered" in str(caught.value)


def test_unsupported_version_lists_the_known_versions(registry: EventRegistry) -> None:
    class CartCreatedV3(Event, type="carts.created", version=3, topic="carts"):
        cart_id: str

    record = encode(CartCreatedV3(cart_id="c1", key="c1"), source="/carts")
    with pytest.raises(EventDecodeError) as caught:
        registry.decode(
            topic=record.topic, key=record.key, value=record.value, headers=record.headers
        )
    assert caught.value.reason is DecodeErrorReason.UNSUPPORTED_VERSION
    assert re.search(r"has no version 3; known versions: 1, 2$", str(caught.value))
