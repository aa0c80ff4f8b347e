"""The compatibility rules of event schemas (#40): one case per kind of change, what it breaks,
and a property that the verdicts agree with decoding (tests/unit/schema_pairs.py)."""

from __future__ import annotations

from decimal import Decimal
from enum import StrEnum
from typing import Annotated, Any, Literal
from uuid import UUID

import pytest
from hypothesis import given, settings
from pydantic import BaseModel, ConfigDict, Field

from outboxkit.schemas import Event, EventRegistry
from outboxkit.schemas.compat.compatibility import (
    ADVICE,
    CompatibilityMode,
    Finding,
    Rule,
    check_compatibility,
    compare_event_schemas,
    compare_snapshots,
)
from outboxkit.schemas.compat.snapshot import (
    Snapshot,
    payload_schema,
)
from tests.docs_snippets import REPO
from tests.unit.schema_pairs import SchemaPair, event, schema_pairs

B, F = "backward", "forward"


class Color(StrEnum):
    RED = "red"
    BLUE = "blue"


class MoreColors(StrEnum):
    RED = "red"
    BLUE = "blue"
    GREEN = "green"


class Line(BaseModel):
    sku: str
    quantity: int = 1


class LineWithPrice(BaseModel):
    sku: str
    quantity: int = 1
    price: Decimal


class LineWithIntSku(BaseModel):
    sku: int
    quantity: int = 1


class StrictLine(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sku: str
    quantity: int = 1


class StrictLineWithoutQuantity(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sku: str


class LineWithoutQuantity(BaseModel):
    sku: str


class Tree(BaseModel):
    name: str
    children: list[Tree] = []


class IntTree(BaseModel):
    name: int
    children: list[IntTree] = []


class Node(BaseModel):
    name: str
    parent: Node | None = None


class IntNode(BaseModel):
    name: int
    parent: IntNode | None = None


Money = Annotated[Decimal, Field(max_digits=10, decimal_places=2)]
MoneyPrecise = Annotated[Decimal, Field(max_digits=11, decimal_places=3)]
MoneyCoarse = Annotated[Decimal, Field(max_digits=9, decimal_places=1)]

#: (change, old fields, new fields, expected findings as (path, rule, directions)).
RULES: list[tuple[str, dict[str, Any], dict[str, Any], list[tuple[str, Rule, str]]]] = [
    ("optional field added", {"a": int}, {"a": int, "b": (int, 0)}, []),
    (
        "required field added",
        {"a": int},
        {"a": int, "b": int},
        [("b", Rule.REQUIRED_FIELD_ADDED, B)],
    ),
    ("optional field removed", {"a": int, "b": (int, 0)}, {"a": int}, []),
    (
        "required field removed",
        {"a": int, "b": int},
        {"a": int},
        [("b", Rule.REQUIRED_FIELD_REMOVED, F)],
    ),
    (
        "field renamed: removed + added",
        {"a": int},
        {"b": int},
        [("b", Rule.REQUIRED_FIELD_ADDED, B), ("a", Rule.REQUIRED_FIELD_REMOVED, F)],
    ),
    ("field became optional", {"a": int}, {"a": (int, 0)}, []),
    ("field became required", {"a": (int, 0)}, {"a": int}, [("a", Rule.FIELD_BECAME_REQUIRED, B)]),
    ("int → int | None", {"a": int}, {"a": int | None}, [("a", Rule.TYPE_WIDENED, F)]),
    ("int → float", {"a": int}, {"a": float}, [("a", Rule.TYPE_WIDENED, F)]),
    ("int | None → int", {"a": int | None}, {"a": int}, [("a", Rule.TYPE_NARROWED, B)]),
    ("float → int", {"a": float}, {"a": int}, [("a", Rule.TYPE_NARROWED, B)]),
    ("str → UUID", {"a": str}, {"a": UUID}, [("a", Rule.TYPE_NARROWED, B)]),
    ("UUID → str", {"a": UUID}, {"a": str}, [("a", Rule.TYPE_WIDENED, F)]),
    ("str → int", {"a": str}, {"a": int}, [("a", Rule.TYPE_CHANGED, B + F)]),
    ("str → Literal", {"a": str}, {"a": Literal["x", "y"]}, [("a", Rule.TYPE_NARROWED, B)]),
    ("Literal → str", {"a": Literal["x", "y"]}, {"a": str}, [("a", Rule.TYPE_WIDENED, F)]),
    (
        "str enum gains a value",
        {"a": Color},
        {"a": MoreColors},
        [("a", Rule.ENUM_VALUE_ADDED, F)],
    ),
    (
        "str enum loses a value",
        {"a": MoreColors},
        {"a": Color},
        [("a", Rule.ENUM_VALUE_REMOVED, B)],
    ),
    (
        "Literal widened",
        {"a": Literal["x"]},
        {"a": Literal["x", "y"]},
        [("a", Rule.ENUM_VALUE_ADDED, F)],
    ),
    (
        "Literal values replaced",
        {"a": Literal["x", "y"]},
        {"a": Literal["x", "z"]},
        [("a", Rule.ENUM_VALUES_CHANGED, B + F)],
    ),
    (
        "Literal → str with a constraint its values meet",
        {"a": Literal["x", "y"]},
        {"a": Annotated[str, Field(max_length=1)]},
        [("a", Rule.TYPE_WIDENED, F)],
    ),
    (
        "max_length tightened",
        {"a": str},
        {"a": Annotated[str, Field(max_length=3)]},
        [("a", Rule.CONSTRAINT_TIGHTENED, B)],
    ),
    (
        "max_length loosened",
        {"a": Annotated[str, Field(max_length=3)]},
        {"a": Annotated[str, Field(max_length=5)]},
        [("a", Rule.CONSTRAINT_LOOSENED, F)],
    ),
    (
        "min_length tightened",
        {"a": Annotated[str, Field(min_length=1)]},
        {"a": Annotated[str, Field(min_length=2)]},
        [("a", Rule.CONSTRAINT_TIGHTENED, B)],
    ),
    (
        "ge tightened to gt",
        {"a": Annotated[int, Field(ge=0)]},
        {"a": Annotated[int, Field(gt=0)]},
        [("a", Rule.CONSTRAINT_TIGHTENED, B)],
    ),
    (
        "le loosened",
        {"a": Annotated[int, Field(le=10)]},
        {"a": Annotated[int, Field(le=100)]},
        [("a", Rule.CONSTRAINT_LOOSENED, F)],
    ),
    (
        "multiple_of tightened",
        {"a": Annotated[int, Field(multiple_of=5)]},
        {"a": Annotated[int, Field(multiple_of=10)]},
        [("a", Rule.CONSTRAINT_TIGHTENED, B)],
    ),
    (
        "pattern added",
        {"a": str},
        {"a": Annotated[str, Field(pattern="^[A-Z]+$")]},
        [("a", Rule.CONSTRAINT_TIGHTENED, B)],
    ),
    (
        "pattern changed (not comparable: both ways)",
        {"a": Annotated[str, Field(pattern="^[A-Z]+$")]},
        {"a": Annotated[str, Field(pattern="^[A-Z0-9]+$")]},
        [("a", Rule.CONSTRAINT_CHANGED, B + F)],
    ),
    (
        "Decimal scale and digits grown",
        {"a": Money},
        {"a": MoneyPrecise},
        [("a", Rule.DECIMAL_PRECISION_WIDENED, F)],
    ),
    (
        "Decimal scale and digits shrunk",
        {"a": Money},
        {"a": MoneyCoarse},
        [("a", Rule.DECIMAL_PRECISION_NARROWED, B)],
    ),
    (
        "Decimal scale grown, digits kept: fewer whole digits",
        {"a": Money},
        {"a": Annotated[Decimal, Field(max_digits=10, decimal_places=3)]},
        [("a", Rule.DECIMAL_PRECISION_CHANGED, B + F)],
    ),
    (
        "Decimal gets a scale",
        {"a": Decimal},
        {"a": Annotated[Decimal, Field(decimal_places=2)]},
        [("a", Rule.DECIMAL_PRECISION_NARROWED, B)],
    ),
    (
        "nested: a list's model gains a required field",
        {"items": list[Line]},
        {"items": list[LineWithPrice]},
        [("items[].price", Rule.REQUIRED_FIELD_ADDED, B)],
    ),
    (
        "nested: a list's model field changes type",
        {"items": list[Line]},
        {"items": list[LineWithIntSku]},
        [("items[].sku", Rule.TYPE_CHANGED, B + F)],
    ),
    (
        "nested: an optional model's field removed (tolerant reader)",
        {"line": (Line | None, None)},
        {"line": (LineWithoutQuantity | None, None)},
        [],
    ),
    (
        "nested: dict values change type",
        {"stock": dict[str, int]},
        {"stock": dict[str, str]},
        [("stock{}", Rule.TYPE_CHANGED, B + F)],
    ),
    (
        "nested: dict keys constrained",
        {"stock": dict[str, int]},
        {"stock": dict[Annotated[str, Field(min_length=3)], int]},
        [("stock{key}", Rule.CONSTRAINT_TIGHTENED, B)],
    ),
    (
        "nested: a tuple's item widened",
        {"pair": tuple[int, str]},
        {"pair": tuple[float, str]},
        [("pair[0]", Rule.TYPE_WIDENED, F)],
    ),
    (
        "nested: a recursive model",
        {"tree": Tree},
        {"tree": IntTree},
        [("tree.name", Rule.TYPE_CHANGED, B + F)],
    ),
    (
        "nested: an optional recursive model",
        {"node": Node},
        {"node": IntNode},
        [("node.name", Rule.TYPE_CHANGED, B + F)],
    ),
    ("list → tuple", {"a": list[int]}, {"a": tuple[int, int]}, [("a", Rule.TYPE_NARROWED, B)]),
    (
        "default changed: a note",
        {"a": (int, 1)},
        {"a": (int, 2)},
        [("a", Rule.DEFAULT_CHANGED, "")],
    ),
]


def _found(old: type[Event], new: type[Event]) -> list[tuple[str, Rule, str]]:
    return _summary(compare_event_schemas(payload_schema(old), payload_schema(new)))


def _summary(findings: list[Finding]) -> list[tuple[str, Rule, str]]:
    def directions(finding: Finding) -> str:
        return (B if CompatibilityMode.BACKWARD in finding.breaks else "") + (
            F if CompatibilityMode.FORWARD in finding.breaks else ""
        )

    return [(f.path, f.rule, directions(f)) for f in findings]


@pytest.mark.parametrize(("change", "old", "new", "expected"), RULES, ids=[r[0] for r in RULES])
def test_a_change_breaks_what_its_rule_says(
    change: str, old: dict[str, Any], new: dict[str, Any], expected: list[tuple[str, Rule, str]]
) -> None:
    assert sorted(_found(event(old), event(new))) == sorted(expected), change


#: The same with readers declared ``strict_reader=True`` (old, new): unknown fields rejected
#: by the models that forbid them (the event itself, and nested models that say so).
STRICT_RULES: list[tuple[str, dict[str, Any], dict[str, Any], tuple[bool, bool], list[Any]]] = [
    (
        "optional field added, the old reader strict",
        {"a": int},
        {"a": int, "b": (int, 0)},
        (True, False),
        [("b", Rule.FIELD_ADDED, F)],
    ),
    (
        "optional field removed, the new reader strict",
        {"a": int, "b": (int, 0)},
        {"a": int},
        (False, True),
        [("b", Rule.FIELD_REMOVED, B)],
    ),
    (
        "required field removed, both strict",
        {"a": int, "b": int},
        {"a": int},
        (True, True),
        [("b", Rule.REQUIRED_FIELD_REMOVED, B + F)],
    ),
    (
        "nested field removed from a model that forbids unknown fields",
        {"line": StrictLine},
        {"line": StrictLineWithoutQuantity},
        (True, True),
        [("line.quantity", Rule.FIELD_REMOVED, B)],
    ),
    (
        "nested field removed from a model that ignores them",
        {"line": Line},
        {"line": LineWithoutQuantity},
        (True, True),
        [],
    ),
]


@pytest.mark.parametrize(
    ("change", "old", "new", "stricts", "expected"),
    STRICT_RULES,
    ids=[r[0] for r in STRICT_RULES],
)
def test_a_strict_reader_rejects_the_fields_it_does_not_declare(
    change: str,
    old: dict[str, Any],
    new: dict[str, Any],
    stricts: tuple[bool, bool],
    expected: list[Any],
) -> None:
    old_strict, new_strict = stricts
    old_doc = payload_schema(event(old, strict_reader=old_strict))
    new_doc = payload_schema(event(new, strict_reader=new_strict))
    found = [f for f in compare_event_schemas(old_doc, new_doc) if f.breaks]
    assert sorted(_summary(found)) == sorted(expected), change


def test_switching_strict_reader_is_a_note() -> None:
    document = payload_schema(event({"a": int}))
    [finding] = compare_event_schemas(
        document, payload_schema(event({"a": int}, strict_reader=True))
    )
    assert finding.rule is Rule.STRICT_READER_CHANGED
    assert not finding.breaks


@pytest.mark.parametrize(
    ("old", "new", "rule"),
    [
        ({"key_field": "a"}, {"key_field": "b"}, Rule.KEY_FIELD_CHANGED),
        ({"topic": "shop.orders"}, {"topic": "shop.orders-v2"}, Rule.TOPIC_CHANGED),
    ],
)
def test_a_new_key_or_topic_breaks_every_mode(
    old: dict[str, Any], new: dict[str, Any], rule: Rule
) -> None:
    """Per-key order and routing: no deploy order makes it safe; a new event type does."""
    fields = {"a": str, "b": str}
    [finding] = compare_event_schemas(
        payload_schema(event(fields, **old)), payload_schema(event(fields, **new))
    )
    assert finding.rule is rule
    assert finding.breaks == frozenset(CompatibilityMode)
    assert "new event type" in finding.advice


# -- versions: what a snapshot kept, what the registry reads --------------------------------


def _snapshot(*models: type[Event], readable: dict[str, tuple[int, ...]] | None = None) -> Snapshot:
    documents = {(m.event_type, m.event_version): payload_schema(m) for m in models}
    return Snapshot(documents, readable or {})


V1, V2 = event({"a": int}, version=1), event({"a": int, "b": int}, version=2)
TRANSITIVE_BACKWARD = {"backward_transitive", "full_transitive"}


def _version_rules(old: Snapshot, new: Snapshot) -> list[tuple[int, Rule, frozenset[str]]]:
    return [
        (f.version, f.rule, frozenset(m.value for m in f.breaks))
        for f in compare_snapshots(old, new)
    ]


def test_dropping_the_latest_version_breaks_backward() -> None:
    assert _version_rules(_snapshot(V1, V2), _snapshot(V1)) == [
        (2, Rule.VERSION_REMOVED, frozenset({"backward", "full", *TRANSITIVE_BACKWARD}))
    ]


def test_dropping_an_older_version_the_snapshot_keeps_breaks_backward() -> None:
    """The snapshot keeps a version until it is pruned: its records may still be read (an
    upcaster removed later fails the check, not the consumers)."""
    assert _version_rules(_snapshot(V1, V2), _snapshot(V2)) == [
        (1, Rule.VERSION_REMOVED, frozenset({"backward", "full", *TRANSITIVE_BACKWARD}))
    ]


def test_a_version_an_upcaster_reads_is_a_note() -> None:
    upcast = _snapshot(V2, readable={"shop.order_placed": (1, 2)})
    assert _version_rules(_snapshot(V1, V2), upcast) == [(1, Rule.VERSION_UPCAST, frozenset())]


def test_the_registrys_upcasters_make_a_version_readable() -> None:
    registry = EventRegistry()
    registry.register(V2)
    registry.upcaster(V2, from_version=1)(lambda payload: {**payload, "b": 0})
    report = check_compatibility(registry, _snapshot(V1, V2), "full_transitive")
    assert report.compatible, report.lines()
    assert [f.rule for f in report.notes] == [Rule.VERSION_UPCAST]


def test_a_new_version_is_a_note_and_keeps_the_key() -> None:
    assert _version_rules(_snapshot(V1), _snapshot(V1, V2)) == [
        (2, Rule.VERSION_ADDED, frozenset())
    ]
    rekeyed = event({"a": int, "b": str}, version=2, key_field="b")
    rules = [rule for _, rule, _ in _version_rules(_snapshot(V1), _snapshot(V1, rekeyed))]
    assert rules == [Rule.VERSION_ADDED, Rule.KEY_FIELD_CHANGED]


def test_a_type_gone_from_the_registry_cannot_be_read() -> None:
    other = event({"x": int}, event_type="shop.other")
    rules = [(v, rule) for v, rule, _ in _version_rules(_snapshot(V1, other), _snapshot(V1))]
    assert rules == [(1, Rule.VERSION_REMOVED)]


# -- the report: a mode picks what breaks ----------------------------------------------------


def test_the_mode_decides_what_breaks_and_what_is_a_note() -> None:
    registry = EventRegistry()
    registry.register(event({"a": Literal["x", "y"]}))
    baseline = _snapshot(event({"a": Literal["x"]}))
    forward = check_compatibility(registry, baseline, "forward")
    backward = check_compatibility(registry, baseline, CompatibilityMode.BACKWARD)
    assert not forward.compatible
    assert [f.rule for f in forward.breaking] == [Rule.ENUM_VALUE_ADDED]
    assert backward.compatible
    assert [f.rule for f in backward.notes] == [Rule.ENUM_VALUE_ADDED]
    assert not check_compatibility(registry, baseline).compatible  # full, by default


def test_the_report_reads_as_a_list_of_changes_and_what_to_do() -> None:
    registry = EventRegistry()
    registry.register(event({"a": int, "coupon": str}))
    report = check_compatibility(registry, _snapshot(event({"a": int})), "full")
    assert report.lines() == [
        "1 change(s) break FULL compatibility:",
        "  shop.order_placed v1 coupon: required field added (no default) — breaks BACKWARD",
        "    older records lack it",
        "    → give it a default, or bump the version and register an upcaster that fills it in",
    ]
    assert report.as_dict()["breaking"] == [
        {
            "type": "shop.order_placed",
            "version": 1,
            "path": "coupon",
            "rule": "required_field_added",
            "change": "no default",
            "why": "older records lack it",
            "breaks": ["backward", "backward_transitive", "full", "full_transitive"],
            "advice": ADVICE[Rule.REQUIRED_FIELD_ADDED],
        }
    ]


def test_a_compatible_report_counts_what_it_checked() -> None:
    registry = EventRegistry()
    registry.register(V1)
    registry.register(V2)
    report = check_compatibility(registry, _snapshot(V1, V2))
    assert report.compatible
    assert report.lines() == ["compatible: 1 type, 2 versions checked (FULL)"]


def test_docs_table_names_every_rule() -> None:
    """docs/schemas.md has one row per rule: a new rule is documented, or this fails."""
    text = (REPO / "docs" / "schemas.md").read_text()
    section = text.split("## Compatibility rules", 1)[1].split("\n## ", 1)[0]
    missing = [rule.value for rule in Rule if f"`{rule.value}`" not in section]
    assert not missing, missing


# -- the property: the verdicts agree with decoding -------------------------------------------


@settings(max_examples=100)
@given(schema_pairs())
def test_the_verdicts_agree_with_decoding(pair: SchemaPair) -> None:
    """For random pairs of models built from field changes (added/removed, optional/required,
    widened/narrowed, enum values, nested models and lists), backward compatibility holds
    exactly when every record the old model writes — and every record older than its
    optional fields — decodes with the new registry, and forward exactly when every record the
    new model writes decodes with the old one."""
    findings = compare_event_schemas(payload_schema(pair.old), payload_schema(pair.new))
    verdict = (
        not any(f.breaks_mode(CompatibilityMode.BACKWARD) for f in findings),
        not any(f.breaks_mode(CompatibilityMode.FORWARD) for f in findings),
    )
    assert verdict == pair.decoding(), [f.lines() for f in findings]
