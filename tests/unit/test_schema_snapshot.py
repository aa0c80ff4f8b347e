"""The exported JSON Schemas of a registry (#40): the payload and the event's routing, a stable
text, file names, and a directory read back (or named when it is not a snapshot)."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Annotated

import pytest
from pydantic import Field

from outboxkit.core.exceptions import ConfigurationError
from outboxkit.schemas.compat.compatibility import compare_snapshots
from outboxkit.schemas.compat.snapshot import Snapshot, payload_schema, render, schema_filename
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
    assert document["x-outboxkit-ce-type"] == "shop.order_placed"
    assert document["x-outboxkit-ce-schemaversion"] == 1
    assert document["x-outboxkit-key-field"] == "order_id"
    assert document["x-outboxkit-topic"] == "shop.orders"
    assert document["x-outboxkit-strict-reader"] is False
    amount = document["properties"]["amount"]
    assert (amount["x-outboxkit-max-digits"], amount["x-outboxkit-decimal-places"]) == (10, 2)


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
