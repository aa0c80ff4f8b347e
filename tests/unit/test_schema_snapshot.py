"""The exported JSON Schemas of a registry: the payload and the event's routing, a stable
text, file names, and a directory read back (or named when it is not a snapshot)."""

from __future__ import annotations

import json
import re
from datetime import datetime
from decimal import Decimal
from typing import Annotated, Any

import pytest
from pydantic import Field

from outboxkit.core.exceptions import ConfigurationError
from outboxkit.schemas.compat.compatibility import compare_snapshots
from outboxkit.schemas.compat.snapshot import (
    Snapshot,
    annotated_form,
    decimal_pattern,
    payload_schema,
    render,
    schema_filename,
)
from tests.unit.schema_pairs import event

Money = Annotated[Decimal, Field(max_digits=10, decimal_places=2)]
V1, V2 = event({"a": int}, version=1), event({"a": int, "b": int}, version=2)


def _snapshot(*models: type) -> Snapshot:
    return Snapshot.from_documents(payload_schema(model) for model in models)


def test_an_exported_schema_is_the_payload_with_the_events_routing() -> None:
    model = event({"order_id": str, "amount": Money}, key_field="order_id")
    document = payload_schema(model)
    assert sorted(document["properties"]) == ["amount", "order_id"]  # no envelope fields
    assert document["required"] == ["order_id", "amount"]
    assert "x-outboxkit-" not in json.dumps(document)  # no keyword a strict validator refuses
    facts = document["$defs"]["x-outboxkit"]["const"]
    assert facts == {
        "ce-type": "shop.order_placed",
        "ce-schemaversion": 1,
        "key-field": "order_id",
        "topic": "shop.orders",
        "strict-reader": False,
        "decimals": {"/properties/amount": {"max-digits": 10, "decimal-places": 2}},
    }
    annotated = annotated_form(document)
    assert annotated["x-outboxkit-ce-type"] == "shop.order_placed"
    amount = annotated["properties"]["amount"]
    assert (amount["x-outboxkit-max-digits"], amount["x-outboxkit-decimal-places"]) == (10, 2)


def _keywords_form(document: dict[str, Any]) -> dict[str, Any]:
    """A document as ``outboxkit schemas export`` wrote it before the facts moved into
    ``$defs``: keywords at the top and on each Decimal."""
    return annotated_form(document)


def test_a_file_exported_in_the_keywords_form_is_still_read() -> None:
    # Its datetime has format: date-time, which the naive one's pattern replaced since.
    model = event({"order_id": str, "amount": Money, "at": datetime}, key_field="order_id")
    old_text = render(_keywords_form(payload_schema(model)))
    assert '"x-outboxkit-ce-type": "shop.order_placed"' in old_text
    assert '"x-outboxkit-max-digits": 10' in old_text
    assert '"format": "date-time"' in old_text
    old = Snapshot.from_files({"shop.order_placed.v1.json": old_text})
    assert old.annotated == _snapshot(model).annotated
    assert not compare_snapshots(old, _snapshot(model))
    narrowed = event(
        {"order_id": str, "amount": Annotated[Decimal, Field(max_digits=9)], "at": datetime}
    )
    assert compare_snapshots(old, _snapshot(narrowed))  # its Decimal's precision is read


def test_the_text_is_stable_and_diff_friendly() -> None:
    document = payload_schema(event({"b": int, "a": str}))
    text = render(document)
    assert text.endswith("}\n")
    assert text == render(json.loads(text))
    assert '\n  "$schema": ' in text  # two spaces, sorted keys
    assert list(json.loads(text)) == sorted(document)


def test_file_names_are_type_and_version() -> None:
    assert schema_filename("shop.order_placed", 3) == "shop.order_placed.v3.json"
    assert schema_filename("shop/orders placed", 1) == "shop%2Forders%20placed.v1.json"


def test_a_snapshot_reads_back_what_it_wrote() -> None:
    snapshot = _snapshot(V1, V2)
    again = Snapshot.from_files(snapshot.files())
    assert again.documents == snapshot.documents
    assert not compare_snapshots(snapshot, again)


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"a.json": "{"}, "a.json: not JSON"),
        ({"a.json": '{"title": "x"}'}, "a.json: not an event schema"),
        ({**_snapshot(V1).files(), "copy.json": render(payload_schema(V1))}, "keep one"),
    ],
)
def test_a_directory_that_is_not_a_snapshot_is_named(files: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Snapshot.from_files(files)


def test_a_decimal_pattern_exported_by_0_1_0_is_the_same_decimal() -> None:
    # 0.1.0 refused 0.00 where max_digits == decimal_places; the pattern now takes it.
    cents = event({"rate": Annotated[Decimal, Field(max_digits=2, decimal_places=2)]})
    document = payload_schema(cents)
    branches = document["properties"]["rate"]["anyOf"]
    assert re.search(branches[1]["pattern"], "0.00")
    branches[1]["pattern"] = decimal_pattern(2, 2, zero_before_point=False)
    assert not re.search(branches[1]["pattern"], "0.00")
    old = Snapshot.from_files({"rate.v1.json": render(document)})
    assert not compare_snapshots(old, _snapshot(cents))
