"""Events that evolve (docs/schemas.md): a tolerant reader by default, a strict writer always,
strict reading per type on request, and upcasters that read older versions as a newer model."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
import structlog
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from outboxkit.schemas import (
    DecodeErrorReason,
    Event,
    EventDecodeError,
    EventDefinitionError,
    EventRegistry,
    RegistryError,
    encode,
)


class OrderPlacedNew(Event, type="shop.order_placed", topic="shop.orders", key_field="order_id"):
    order_id: str
    amount: int
    coupon: str | None = None  # added by the producer team


class OrderPlacedOld(Event, type="shop.order_placed", topic="shop.orders", key_field="order_id"):
    order_id: str
    amount: int


def decode(registry: EventRegistry, event: Event, **kwargs: Any) -> Event:
    wire = encode(event, source="urn:shop")
    return registry.decode(
        topic=wire.topic, key=wire.key, value=wire.value, headers=wire.headers, **kwargs
    )


def test_a_consumer_on_the_old_model_reads_an_event_with_a_field_it_does_not_know() -> None:
    """The issue's case: the producer added an optional field and deployed first."""
    registry = EventRegistry()
    registry.register(OrderPlacedOld)
    sent = OrderPlacedNew(order_id="o1", amount=5, coupon="X")
    unknown: list[str] = []
    with structlog.testing.capture_logs() as logs:
        event = decode(registry, sent, unknown_fields=unknown)
        decode(registry, OrderPlacedNew(order_id="o2", amount=6, coupon="Y"))
    assert isinstance(event, OrderPlacedOld)
    assert (event.id, event.key, event.order_id, event.amount) == (sent.id, "o1", "o1", 5)
    assert event.occurred_at == sent.occurred_at
    assert unknown == ["coupon"]
    ignored = [entry for entry in logs if "ignored payload fields" in entry["event"]]
    assert len(ignored) == 1, logs  # once per type and version
    assert ignored[0]["fields"] == "coupon"
    assert (ignored[0]["event_type"], ignored[0]["event_version"]) == ("shop.order_placed", 1)


def test_a_consumer_on_the_new_model_reads_an_old_event_with_the_default() -> None:
    registry = EventRegistry()
    registry.register(OrderPlacedNew)
    event = decode(registry, OrderPlacedOld(order_id="o1", amount=5))
    assert isinstance(event, OrderPlacedNew)
    assert event.coupon is None


class Line(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    sku: str


class Basket(Event, type="shop.basket", topic="shop.baskets", key_field="basket_id"):
    basket_id: str
    first: Line
    lines: list[Line] = Field(default_factory=list)


def test_unknown_fields_of_nested_models_are_ignored_too() -> None:
    registry = EventRegistry()
    registry.register(Basket)
    sent = Basket(basket_id="b", first=Line(sku="a"), lines=[Line(sku="b")])
    wire = encode(sent, source="urn:shop")
    value = (
        b'{"basket_id":"b","first":{"sku":"a","colour":"red"},'
        b'"lines":[{"sku":"b","size":3}],"gift":true}'
    )
    unknown: list[str] = []
    event = registry.decode(
        topic=wire.topic, key=wire.key, value=value, headers=wire.headers, unknown_fields=unknown
    )
    assert event == sent
    assert sorted(unknown) == ["colour", "gift", "size"]


def test_an_escaped_payload_takes_the_careful_path_and_is_tolerated_the_same() -> None:
    registry = EventRegistry()
    registry.register(OrderPlacedOld)
    wire = encode(OrderPlacedOld(order_id="o1", amount=5), source="urn:shop")
    value = b'{"order_id":"\\u006f1","amount":5,"coupon":"X"}'  # \u: not spliced
    event = registry.decode(topic=wire.topic, key=wire.key, value=value, headers=wire.headers)
    assert event.order_id == "o1"  # type: ignore[attr-defined]


class StrictOrder(
    Event, type="shop.order_placed", topic="shop.orders", key_field="order_id", strict_reader=True
):
    order_id: str
    amount: int


class StricterOrder(StrictOrder, type="shop.order_placed_again"):
    pass


def test_a_type_may_ask_for_strict_reading() -> None:
    registry = EventRegistry()
    registry.register(StrictOrder)
    with pytest.raises(EventDecodeError, match="coupon: Extra inputs are not permitted") as caught:
        decode(registry, OrderPlacedNew(order_id="o1", amount=5, coupon="X"))
    assert caught.value.reason is DecodeErrorReason.INVALID_PAYLOAD
    assert StricterOrder.event_strict_reader is True  # inherited
    assert OrderPlacedOld.event_strict_reader is False


def test_strict_reader_must_be_a_bool() -> None:
    with pytest.raises(EventDefinitionError, match="strict_reader must be a bool"):

        class _Bad(Event, topic="t", key_field="k", strict_reader="yes"):  # type: ignore[arg-type]
            k: str


def test_writing_stays_strict() -> None:
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        OrderPlacedOld(order_id="o1", amount=5, coupon="X")  # type: ignore[call-arg]


class PriceV1(Event, type="shop.price", version=1, topic="shop.prices", key_field="sku"):
    sku: str
    cents: int


class PriceV2(Event, type="shop.price", version=2, topic="shop.prices", key_field="sku"):
    sku: str
    amount: str  # "12.34"
    currency: str


class PriceV3(Event, type="shop.price", version=3, topic="shop.prices", key_field="sku"):
    sku: str
    amount: str
    currency: str
    vat_included: bool


def v1_to_v2(payload: dict[str, Any]) -> dict[str, Any]:
    cents = payload.pop("cents")
    return {**payload, "amount": f"{cents // 100}.{cents % 100:02d}", "currency": "EUR"}


def v2_to_v3(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "vat_included": True}


def upcasting_registry() -> EventRegistry:
    registry = EventRegistry()
    registry.register(PriceV3)
    registry.upcaster(PriceV2, from_version=1)(v1_to_v2)
    registry.upcaster(PriceV3, from_version=2)(v2_to_v3)
    return registry


def test_older_versions_are_read_as_the_newest_model_through_a_chain_of_upcasters() -> None:
    registry = upcasting_registry()
    v1 = PriceV1(sku="s", cents=1234, headers={"tenant": "t1"})
    event = decode(registry, v1)
    assert isinstance(event, PriceV3)
    assert (event.amount, event.currency, event.vat_included) == ("12.34", "EUR", True)
    assert (event.id, event.key, event.occurred_at, event.headers) == (
        v1.id,
        "s",
        v1.occurred_at,
        {"tenant": "t1"},
    )
    v2 = decode(registry, PriceV2(sku="s", amount="1.00", currency="USD"))
    assert isinstance(v2, PriceV3)
    assert v2.currency == "USD"
    assert registry.readable_versions("shop.price") == (1, 2, 3)
    assert registry.versions("shop.price") == (3,)
    assert registry.upcast_versions("shop.price") == {1: PriceV3, 2: PriceV3}


def test_an_upcaster_wins_over_a_model_of_its_own_version() -> None:
    """Registering the v1 model too (a shared events module does) must not take v1 records
    away from the handler written for the newest version."""
    registry = upcasting_registry()
    registry.register(PriceV1)
    assert isinstance(decode(registry, PriceV1(sku="s", cents=1)), PriceV3)


def test_a_version_without_a_model_or_a_whole_chain_names_the_versions_it_knows() -> None:
    registry = EventRegistry()
    registry.register(PriceV3)
    registry.upcaster(PriceV2, from_version=1)(v1_to_v2)  # but no way from 2 to 3
    with pytest.raises(EventDecodeError, match="has no version 1; known versions: 3") as caught:
        decode(registry, PriceV1(sku="s", cents=1))
    assert caught.value.reason is DecodeErrorReason.UNSUPPORTED_VERSION
    assert registry.readable_versions("shop.price") == (3,)


def test_an_upcaster_that_fails_dead_letters_the_record_with_a_reason() -> None:
    registry = EventRegistry()
    registry.register(PriceV2)

    @registry.upcaster(PriceV2, from_version=1)
    def broken(payload: dict[str, Any]) -> dict[str, Any]:
        return {**payload, "amount": str(payload["missing"])}

    with pytest.raises(
        EventDecodeError, match=r"shop.price v1: upcaster to v2 .*broken.* raised KeyError"
    ) as caught:
        decode(registry, PriceV1(sku="s", cents=1))
    assert caught.value.reason is DecodeErrorReason.INVALID_PAYLOAD


@pytest.mark.parametrize(
    ("result", "message"),
    [
        ([1, 2], "returned a list, not a dict"),
        (
            {"sku": "s", "amount": "1", "currency": "EUR", "id": "x"},
            "payload fields only, found id",
        ),
        ({"sku": "s", "amount": "1"}, "shop.price v1 as v2: currency: Field required"),
    ],
)
def test_an_upcaster_whose_result_is_not_a_payload_of_its_target_is_reported(
    result: Any, message: str
) -> None:
    registry = EventRegistry()
    registry.register(PriceV2)
    registry.upcaster(PriceV2, from_version=1)(lambda _: result)
    with pytest.raises(EventDecodeError, match=message) as caught:
        decode(registry, PriceV1(sku="s", cents=1))
    assert caught.value.reason is DecodeErrorReason.INVALID_PAYLOAD


def test_an_upcast_payload_is_read_tolerantly_too() -> None:
    registry = EventRegistry()
    registry.register(PriceV2)
    registry.upcaster(PriceV2, from_version=1)(lambda p: {**v1_to_v2(p), "legacy": 1})
    unknown: list[str] = []
    assert isinstance(decode(registry, PriceV1(sku="s", cents=1), unknown_fields=unknown), PriceV2)
    assert unknown == ["legacy"]


@pytest.mark.parametrize(
    ("target", "from_version", "message"),
    [
        (PriceV2, 2, "comes from an older version \\(1 to 1\\), not 2"),
        (PriceV2, 0, "not 0"),
        (PriceV1, 1, "comes from an older version \\(1 to 0\\), not 1"),
        (PriceV2, True, "from_version must be an int"),
        (Event, 1, "is not a subclass of Event"),
        (dict, 1, "is not a subclass of Event"),
    ],
)
def test_an_upcaster_must_go_from_an_older_version(
    target: Any, from_version: Any, message: str
) -> None:
    with pytest.raises(RegistryError, match=message):
        EventRegistry().upcaster(target, from_version=from_version)


def test_one_upcaster_per_version() -> None:
    registry = EventRegistry()
    registry.upcaster(PriceV2, from_version=1)(v1_to_v2)
    registry.upcaster(PriceV2, from_version=1)(v1_to_v2)  # the same again: nothing happens
    with pytest.raises(RegistryError, match=r"version 1 already has an upcaster .*v1_to_v2"):
        registry.upcaster(PriceV3, from_version=1)(v2_to_v3)


def test_a_registry_with_upcasters_pickles_for_spark_executors() -> None:
    copy = pickle.loads(pickle.dumps(upcasting_registry()))
    assert isinstance(decode(copy, PriceV1(sku="s", cents=5)), PriceV3)


class Described(Event, type="shop.described", version=4, topic="t", key_field="k"):
    k: str


class ElsewhereDescribed(
    Event, type="shop.elsewhere", topic="t", key_field="k", dataschema="https://schemas.example/e/1"
):
    k: str


class DescribedChild(ElsewhereDescribed, type="shop.child"):
    pass


def test_each_record_names_its_schema_in_ce_dataschema() -> None:
    assert dict(encode(Described(k="a"), source="s").headers)["ce_dataschema"] == (
        b"urn:outboxkit:schema:shop.described:4"
    )
    assert dict(encode(ElsewhereDescribed(k="a"), source="s").headers)["ce_dataschema"] == (
        b"https://schemas.example/e/1"
    )
    assert DescribedChild.event_dataschema == "urn:outboxkit:schema:shop.child:1"  # not inherited

    class Odd(Event, type='odd "type" {x}', topic="t", key_field="k"):
        k: str

    assert Odd.event_dataschema == "urn:outboxkit:schema:odd%20%22type%22%20%7Bx%7D:1"


def test_a_record_without_ce_dataschema_decodes_as_before() -> None:
    registry = EventRegistry()
    registry.register(Described)
    sent = Described(k="a")
    wire = encode(sent, source="s")
    headers = [(name, value) for name, value in wire.headers if name != "ce_dataschema"]
    assert registry.decode(topic="t", key=wire.key, value=wire.value, headers=headers) == sent


@pytest.mark.parametrize("uri", ["", "no-scheme", "urn:with space", 5])
def test_dataschema_must_be_an_absolute_uri(uri: Any) -> None:
    with pytest.raises(EventDefinitionError, match="dataschema must be an absolute URI"):

        class _Bad(Event, topic="t", key_field="k", dataschema=uri):
            k: str
