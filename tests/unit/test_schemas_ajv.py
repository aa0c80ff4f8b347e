"""The exported schemas in Ajv 8, the validator a TypeScript consumer uses, in its strict mode:
every file compiles as it is (no keyword Ajv does not know, no format it cannot check), every
record the writer produces validates, and a changed type or a Decimal that breaks its places
fails, with the same verdicts as Python's ``jsonschema``. Ajv and ajv-formats come from the npm
registry at pinned versions, cached in ``~/.cache/outboxkit`` (tests/nodetools.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from enum import StrEnum
from typing import Annotated, Any, Literal
from uuid import UUID

import pytest
from jsonschema import Draft202012Validator, FormatChecker
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from outboxkit.demo.events import registry as demo_registry
from outboxkit.schemas import Event, EventRegistry, encode
from outboxkit.schemas.compat.snapshot import Snapshot
from tests.nodetools import AJV, NodeInstallError

pytestmark = pytest.mark.skipif(
    shutil.which("node") is None, reason="Node.js is not installed: Ajv cannot run"
)

# Reads the schemas and the payloads from stdin, answers each payload's verdict in both modes.
_SCRIPT = r"""
const Ajv2020 = require("ajv/dist/2020");
const addFormats = require("ajv-formats");
const input = JSON.parse(require("fs").readFileSync(0, "utf8"));
const verdicts = {};
for (const [mode, options] of [["default", {}], ["strict", {strict: true}]]) {
  const ajv = new Ajv2020(options);
  addFormats(ajv);
  for (const schema of input.schemas) ajv.addSchema(schema);
  verdicts[mode] = input.cases.map(([id, payload]) => ajv.getSchema(id)(payload));
}
console.log(JSON.stringify(verdicts));
"""


class Colour(StrEnum):
    RED = "red"


class Line(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sku: Annotated[str, Field(min_length=1, max_length=8)]
    quantity: Annotated[int, Field(gt=0, le=1000)]


Money = Annotated[Decimal, Field(max_digits=10, decimal_places=2, ge=0)]


class Everything(Event, type="test.ajv.everything", topic="t", key_field="order_id"):
    order_id: UUID
    total: Money
    ratio: Decimal
    placed_at: AwareDatetime
    seen_at: datetime
    due: date
    colour: Colour
    level: Literal[1, 2, 3]
    weight: float
    paid: bool
    lines: list[Line]
    stock: dict[str, int]
    pair: tuple[int, str]
    note: str | None = None
    either: int | bool = 0


class Strict(Event, type="test.ajv.strict", topic="t", strict_reader=True):
    line: Line


def _registry() -> EventRegistry:
    registry = EventRegistry()
    for model in (Everything, Strict, *demo_registry):
        registry.register(model)
    return registry


def _payload(event: Event) -> dict[str, Any]:
    payload: dict[str, Any] = json.loads(encode(event, source="urn:test").value)
    return payload


WRITTEN = [
    Everything(
        order_id=UUID(int=7),
        total=Decimal("19.90"),
        ratio=Decimal("-1E+2"),
        placed_at=datetime(2024, 5, 1, 12, tzinfo=timezone(timedelta(hours=2))),
        seen_at=datetime(2024, 5, 1, 12, 0, 0, 123456),  # naive
        due=date(2024, 5, 2),
        colour=Colour.RED,
        level=2,
        weight=0.1,
        paid=True,
        lines=[Line(sku="tea", quantity=3)],
        stock={"tea": 4},
        pair=(1, "a"),
        note="gift",
    ),
    Everything(
        order_id=UUID(int=8),
        total=Decimal("0"),
        ratio=Decimal("0.000001"),
        placed_at=datetime(1, 1, 2, tzinfo=UTC),
        seen_at=datetime(2024, 5, 1, 12, tzinfo=UTC),
        due=date(9999, 12, 31),
        colour=Colour.RED,
        level=1,
        weight=-1e300,
        paid=False,
        lines=[],
        stock={},
        pair=(0, ""),
        either=True,
    ),
    Strict(key="k", line=Line(sku="s", quantity=1)),
]
GOOD = _payload(WRITTEN[0])
REFUSED = [
    {**GOOD, "total": "19.805"},  # three places, two allowed
    {**GOOD, "total": "123456789.00"},  # nine whole digits, eight allowed
    {**GOOD, "total": "twelve"},
    {**GOOD, "order_id": "not-a-uuid"},
    {**GOOD, "placed_at": "yesterday"},
    {**GOOD, "due": "2024-13-01"},
    {**GOOD, "level": 4},
    {**GOOD, "lines": [{"sku": "", "quantity": 1}]},
    {**GOOD, "lines": [{"sku": "s", "quantity": 0}]},
    {**GOOD, "pair": [1]},
    {key: value for key, value in GOOD.items() if key != "paid"},
    {**GOOD, "paid": "yes"},
]


def _ajv(schemas: list[dict[str, Any]], cases: list[tuple[str, Any]]) -> dict[str, list[bool]]:
    try:
        modules = AJV.path() / "node_modules"
    except NodeInstallError as exc:
        pytest.fail(str(exc), pytrace=False)
    result = subprocess.run(
        ["node", "-e", _SCRIPT],
        input=json.dumps({"schemas": schemas, "cases": cases}),
        env={**os.environ, "NODE_PATH": str(modules)},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    verdicts: dict[str, list[bool]] = json.loads(result.stdout)
    return verdicts


def test_ajv_in_strict_mode_reads_the_files_as_jsonschema_does() -> None:
    files = Snapshot.of_registry(_registry()).files()
    schemas = [json.loads(text) for text in files.values()]
    by_type = {schema["$id"]: schema for schema in schemas}
    everything, strict = Everything.event_dataschema, Strict.event_dataschema
    cases: list[tuple[str, Any]] = [
        *((type(e).event_dataschema, _payload(e)) for e in WRITTEN),
        *((everything, payload) for payload in REFUSED),
        (everything, {**GOOD, "gift_wrap": True}),  # a field a newer producer added
        (strict, {"line": {"sku": "s", "quantity": 1}, "gift_wrap": True}),
    ]
    expected = [True] * len(WRITTEN) + [False] * len(REFUSED) + [True, False]
    python = [
        Draft202012Validator(by_type[id_], format_checker=FormatChecker()).is_valid(payload)
        for id_, payload in cases
    ]
    verdicts = _ajv(schemas, cases)
    assert python == expected
    assert verdicts == {"default": expected, "strict": expected}
