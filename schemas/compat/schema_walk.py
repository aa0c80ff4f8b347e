"""How :mod:`outboxkit.schemas.compat.compatibility` compares two JSON Schemas of one event.

A :class:`Walk` asks whether everything a *writer's* schema allows, a *reader's* schema accepts,
and names each place where it does not as a :class:`Gap`: a path (``items[].sku``), a family of
change (``type``, ``enum``, ``constraint``, ``decimal``, a field ``added``/``removed``/
``became_required``, a ``default`` changed), what changed (old → new) and why a reader fails.
It is run twice per schema, once per direction; the compatibility module names the rule from
the directions a gap shows up in (a type gap in the backward walk only is a narrowing).

It knows the JSON Schema pydantic writes: local ``$ref``/``$defs`` (recursive models too),
``anyOf``/``oneOf``/single ``allOf``, lists of types, ``enum``/``const``, ``format``,
``items``/``prefixItems``, ``properties``/``required``/``additionalProperties``,
``propertyNames``, the length, bound, ``multipleOf`` and ``pattern`` constraints, and the
``Decimal`` annotations of :mod:`outboxkit.schemas.compat.snapshot`. Where it cannot prove that a
reader accepts a value (two different patterns) it says it may not: a false alarm is a line to
read, a missed break is a consumer down.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

from outboxkit.schemas.compat.snapshot import (
    DECIMAL_PLACES_KEY,
    MAX_DIGITS_KEY,
    STRICT_READER_KEY,
    SchemaDocument,
    decimal_patterns,
)

Direction = Literal["backward", "forward"]
"""``backward``: the new schema reads data of the old one; ``forward``: the other way round."""


@dataclass(frozen=True)
class Gap:
    """Something a writer's data may hold that a reader rejects, found walking one direction.
    ``family`` is a field-change family (``type``, ``enum``…) or ``added``/``removed``/
    ``became_required``/``default``; ``change`` reads old → new."""

    direction: Direction
    path: str
    family: str
    change: str
    why: str
    required: bool = False


_NUMERIC = ("integer", "number")
_LENGTHS = (
    ("minLength", "maxLength"),
    ("minItems", "maxItems"),
    ("minProperties", "maxProperties"),
)
#: Where a resolved node came from (the ``$ref`` followed): recursive models end the walk.
_RESOLVED_FROM = "x-resolved-from"
#: Keys of a node that say nothing about which values it accepts (kept off the branches).
_ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "deprecated",
        "readOnly",
        "writeOnly",
        "$comment",
        _RESOLVED_FROM,
    }
)


class Walk:
    """Whether everything a writer's schema allows, a reader's schema accepts; each place where
    it does not is a :class:`Gap`. ``backward``: the reader is the new schema, the writer the
    old one (whose optional fields old records may lack); ``forward``: the other way round."""

    def __init__(self, *, reader: SchemaDocument, writer: SchemaDocument, direction: Direction):
        self.reader_root, self.writer_root = reader, writer
        self.direction = direction
        self.strict = bool(reader.get(STRICT_READER_KEY, False))
        #: Records older than an optional field lack it: only the old schema's records.
        self.writer_may_omit_optional = direction == "backward"
        self._visiting: set[tuple[str, str]] = set()

    def gaps(self) -> list[Gap]:
        return self.covers(self.reader_root, self.writer_root, "")

    # -- the old → new wording of what the two sides say -----------------------------------

    def _old_new(self, reader_value: object, writer_value: object) -> tuple[object, object]:
        if self.direction == "backward":
            return writer_value, reader_value
        return reader_value, writer_value

    def _gap(self, path: str, family: str, change: str, why: str, required: bool = False) -> Gap:
        return Gap(self.direction, path, family, change, why, required)

    def _changed(self, reader: Any, writer: Any) -> str:
        old, new = self._old_new(
            describe(reader, self.reader_root), describe(writer, self.writer_root)
        )
        return f"{old} → {new}"

    # -- the walk ------------------------------------------------------------------------------

    def covers(self, reader: Any, writer: Any, path: str) -> list[Gap]:
        """The gaps between two nodes at ``path`` (each maybe a union, or a ``$ref``)."""
        gaps = self._default_changed(reader, writer, path)
        readers = _branches(reader, self.reader_root)
        if any(_kind(branch) == "any" for branch in readers):
            return gaps
        for branch in _branches(writer, self.writer_root):
            if _kind(branch) == "never":
                continue
            candidates = [r for r in readers if _kinds_meet(r, branch)]
            if not candidates:
                gaps.append(self._type_gap(reader, writer, path))
                continue
            attempts = [self._fits(candidate, branch, path) for candidate in candidates]
            # The first candidate that fits (its notes only), or the closest: it says what is
            # wrong.
            fitting = [attempt for attempt in attempts if not _breaking(attempt)]
            chosen: list[Gap] = fitting[0] if fitting else min(attempts, key=_breaking_count)
            gaps += chosen
        return _dedupe(gaps)

    def _type_gap(self, reader: Any, writer: Any, path: str) -> Gap:
        why = (
            "older records may hold values the new model rejects"
            if self.direction == "backward"
            else "readers of the snapshot reject values the new model allows"
        )
        return self._gap(path, "type", self._changed(reader, writer), why)

    def _default_changed(self, reader: Any, writer: Any, path: str) -> list[Gap]:
        if not path or not isinstance(reader, dict) or not isinstance(writer, dict):
            return []
        if "default" not in reader or "default" not in writer:
            return []
        if reader["default"] == writer["default"]:
            return []
        old, new = self._old_new(reader["default"], writer["default"])
        change = f"{_json(old)} → {_json(new)}"
        why = "new events carry the new default; records already written keep the old value"
        return [self._gap(path, "default", change, why)]

    def _fits(self, reader: dict[str, Any], writer: dict[str, Any], path: str) -> list[Gap]:
        """The gaps between one branch of each side, of kinds that meet."""
        reader_ref, writer_ref = reader.get(_RESOLVED_FROM), writer.get(_RESOLVED_FROM)
        if not isinstance(reader_ref, str) or not isinstance(writer_ref, str):
            return self._fits_branch(reader, writer, path)
        pair = (reader_ref, writer_ref)
        if pair in self._visiting:  # a recursive model, compared further up already
            return []
        self._visiting.add(pair)
        try:
            return self._fits_branch(reader, writer, path)
        finally:
            self._visiting.discard(pair)

    def _fits_branch(self, reader: dict[str, Any], writer: dict[str, Any], path: str) -> list[Gap]:
        reader_values, writer_values = _values(reader), _values(writer)
        if reader_values is not None:
            if writer_values is None:
                return [self._type_gap(reader, writer, path)]
            missing = [v for v in writer_values if v not in reader_values]
            if missing:
                return [self._enum_gap(missing, path)]
            return []
        if writer_values is not None:
            rejected = [v for v in writer_values if not _accepts(reader, v)]
            return [self._rejected_values_gap(rejected, path)] if rejected else []
        if reader.get("format") not in (None, writer.get("format")):
            return [self._type_gap(reader, writer, path)]
        if "prefixItems" in reader and "prefixItems" not in writer:  # a list → a tuple
            return [self._type_gap(reader, writer, path)]
        gaps = self._constraints(reader, writer, path)
        kind = _kind(reader)
        if kind == "array":
            gaps += self._array(reader, writer, path)
        elif kind == "object":
            gaps += self._object(reader, writer, path)
        return gaps

    def _rejected_values_gap(self, values: list[Any], path: str) -> Gap:
        """Values of a writer's ``enum`` that the reader's open type rejects."""
        listed = ", ".join(_json(v) for v in values)
        if self.direction == "backward":
            return self._gap(
                path,
                "constraint",
                f"{listed} no longer accepted",
                "older records may not meet the tighter constraint",
            )
        return self._gap(
            path,
            "constraint",
            f"{listed} now allowed",
            "readers of the snapshot reject values the looser constraint allows",
        )

    def _enum_gap(self, values: list[Any], path: str) -> Gap:
        listed = ", ".join(_json(v) for v in values)
        if self.direction == "backward":
            return self._gap(
                path, "enum", f"removed {listed}", "older records may hold the removed value(s)"
            )
        return self._gap(
            path, "enum", f"added {listed}", "readers of the snapshot reject the new value(s)"
        )

    def _constraints(self, reader: dict[str, Any], writer: dict[str, Any], path: str) -> list[Gap]:
        changes: list[str] = []
        for low, high in _LENGTHS:
            if low in reader and writer.get(low, 0) < reader[low]:
                changes.append(self._constraint_change(low, reader, writer))
            if high in reader and (high not in writer or writer[high] > reader[high]):
                changes.append(self._constraint_change(high, reader, writer))
        if _kind(reader) in _NUMERIC:
            changes += self._bounds(reader, writer)
        if (
            "pattern" in reader
            and writer.get("pattern") != reader["pattern"]
            and not _decimal_text(reader)
        ):
            changes.append(self._constraint_change("pattern", reader, writer))
        gaps = []
        if changes:
            why = (
                "older records may not meet the tighter constraint"
                if self.direction == "backward"
                else "readers of the snapshot reject values the looser constraint allows"
            )
            gaps.append(self._gap(path, "constraint", "; ".join(changes), why))
        decimal = self._decimal(reader, writer)
        if decimal:
            why = (
                "older records may hold amounts the new precision rejects"
                if self.direction == "backward"
                else "readers of the snapshot reject amounts the new precision allows"
            )
            gaps.append(self._gap(path, "decimal", "; ".join(decimal), why))
        return gaps

    def _constraint_change(self, key: str, reader: dict[str, Any], writer: dict[str, Any]) -> str:
        old, new = self._old_new(reader.get(key), writer.get(key))
        return f"{key} {_json(old) if old is not None else 'none'} → " + (
            _json(new) if new is not None else "none"
        )

    def _bounds(self, reader: dict[str, Any], writer: dict[str, Any]) -> list[str]:
        changes = []
        for inclusive, exclusive, sign in (
            ("minimum", "exclusiveMinimum", 1),
            ("maximum", "exclusiveMaximum", -1),
        ):
            reader_bound, writer_bound = (
                _bound(reader, inclusive, exclusive),
                _bound(writer, inclusive, exclusive),
            )
            if reader_bound is None:
                continue
            tighter = writer_bound is None or (
                sign * (writer_bound[0] - reader_bound[0]) < 0
                or (writer_bound[0] == reader_bound[0] and reader_bound[1] and not writer_bound[1])
            )
            if tighter:
                key = exclusive if reader_bound[1] else inclusive
                changes.append(self._constraint_change(key, reader, writer))
        if "multipleOf" in reader:
            step = Decimal(str(reader["multipleOf"]))
            given = writer.get("multipleOf")
            if given is None or Decimal(str(given)) % step != 0:
                changes.append(self._constraint_change("multipleOf", reader, writer))
        return changes

    def _decimal(self, reader: dict[str, Any], writer: dict[str, Any]) -> list[str]:
        """``Decimal(max_digits, decimal_places)``: at most ``places`` decimals and
        ``digits - places`` whole digits."""
        changes = []
        places_r, places_w = reader.get(DECIMAL_PLACES_KEY), writer.get(DECIMAL_PLACES_KEY)
        digits_r, digits_w = reader.get(MAX_DIGITS_KEY), writer.get(MAX_DIGITS_KEY)
        if places_r is not None and (places_w is None or places_w > places_r):
            old, new = self._old_new(places_r, places_w)
            changes.append(f"decimal_places {old} → {new}")
        if digits_r is not None and (digits_w is None or digits_w > digits_r):
            old, new = self._old_new(digits_r, digits_w)
            changes.append(f"max_digits {old} → {new}")
        elif _whole_digits(digits_w, places_w) > _whole_digits(digits_r, places_r):
            old, new = self._old_new(
                int(_whole_digits(digits_r, places_r)), int(_whole_digits(digits_w, places_w))
            )
            changes.append(f"whole digits (max_digits - decimal_places) {old} → {new}")
        return changes

    def _array(self, reader: dict[str, Any], writer: dict[str, Any], path: str) -> list[Gap]:
        reader_prefix, writer_prefix = reader.get("prefixItems"), writer.get("prefixItems")
        gaps: list[Gap] = []
        if reader_prefix is not None:
            pairs = zip(reader_prefix, writer_prefix or [], strict=False)  # (a tuple: _fits)
            for index, (r, w) in enumerate(pairs):
                gaps += self.covers(r, w, f"{path}[{index}]")
            return gaps
        items = reader.get("items", {})
        for index, w in enumerate(writer_prefix or []):
            gaps += self.covers(items, w, f"{path}[{index}]")
        if writer_prefix is None:
            gaps += self.covers(items, writer.get("items", {}), f"{path}[]")
        return gaps

    def _object(self, reader: dict[str, Any], writer: dict[str, Any], path: str) -> list[Gap]:
        gaps: list[Gap] = []
        reader_fields, writer_fields = reader.get("properties", {}), writer.get("properties", {})
        reader_required, writer_required = (
            set(reader.get("required", [])),
            set(writer.get("required", [])),
        )
        reader_extra = reader.get("additionalProperties", True)
        for name, reader_field in reader_fields.items():
            where = _join(path, name)
            if name in writer_fields:
                gaps += self.covers(reader_field, writer_fields[name], where)
                omitted = name not in writer_required and self.writer_may_omit_optional
                if name in reader_required and omitted:
                    gaps.append(
                        self._gap(
                            where,
                            "became_required",
                            "its default was removed",
                            "records written before the field existed lack it (what its "
                            "default was for)",
                        )
                    )
            elif name in reader_required:
                gaps.append(self._missing_field(where))
        for name, writer_field in writer_fields.items():
            if name in reader_fields:
                continue
            where = _join(path, name)
            if isinstance(reader_extra, dict):
                gaps += self.covers(reader_extra, writer_field, where)
            elif reader_extra is False and self.strict:
                gaps.append(self._unknown_field(where, required=name in writer_required))
        writer_extra = writer.get("additionalProperties", "properties" not in writer)
        if writer_extra is not False and writer_extra is not None:
            values = writer_extra if isinstance(writer_extra, dict) else {}
            if isinstance(reader_extra, dict):
                gaps += self.covers(reader_extra, values, f"{path}{{}}")
            elif reader_fields and not writer_fields:
                gaps.append(self._type_gap(reader, writer, path))
        if isinstance(reader.get("propertyNames"), dict):  # keys: strings, maybe constrained
            keys = {"type": "string", **writer.get("propertyNames", {})}
            reader_keys = {"type": "string", **reader["propertyNames"]}
            gaps += self.covers(reader_keys, keys, f"{path}{{key}}")
        return gaps

    def _missing_field(self, path: str) -> Gap:
        """The reader requires a field the writer does not have."""
        if self.direction == "backward":
            return self._gap(path, "added", "no default", "older records lack it", required=True)
        return self._gap(
            path,
            "removed",
            "it had no default",
            "readers of the snapshot require it",
            required=True,
        )

    def _unknown_field(self, path: str, *, required: bool) -> Gap:
        """The writer has a field the strict reader does not declare."""
        if self.direction == "backward":
            return self._gap(
                path,
                "removed",
                "it had no default" if required else "it had a default",
                "older records carry it, and the strict reader rejects a field it does not declare",
                required=required,
            )
        return self._gap(
            path,
            "added",
            "no default" if required else "with a default",
            "the strict readers of the snapshot reject a field they do not declare",
            required=required,
        )


def _breaking(gaps: list[Gap]) -> list[Gap]:
    return [gap for gap in gaps if gap.family != "default"]


def _breaking_count(gaps: list[Gap]) -> int:
    return len(_breaking(gaps))


def _accepts(reader: dict[str, Any], value: object) -> bool:
    """Whether one value meets an open branch's type and constraints (those of strings and
    numbers; a pattern as Python's ``re`` reads it)."""
    kind = _json_kind(value)
    if not (kind == _kind(reader) or (kind == "integer" and _kind(reader) == "number")):
        return False
    if isinstance(value, str):
        if len(value) < reader.get("minLength", 0) or len(value) > reader.get(
            "maxLength", len(value)
        ):
            return False
        pattern = reader.get("pattern")
        return pattern is None or re.search(pattern, value) is not None
    if isinstance(value, int | float) and not isinstance(value, bool):
        lower = _bound(reader, "minimum", "exclusiveMinimum")
        upper = _bound(reader, "maximum", "exclusiveMaximum")
        if lower is not None and (value < lower[0] or (lower[1] and value == lower[0])):
            return False
        if upper is not None and (value > upper[0] or (upper[1] and value == upper[0])):
            return False
    return True


def _decimal_text(node: dict[str, Any]) -> bool:
    """Whether ``node``'s pattern is the one a ``Decimal``'s text gets from its precision
    (judged by the ``decimal`` rules, not as a pattern: exports before it had none)."""
    return node.get("pattern") in decimal_patterns(
        node.get(MAX_DIGITS_KEY), node.get(DECIMAL_PLACES_KEY)
    )


def _whole_digits(max_digits: int | None, decimal_places: int | None) -> float:
    """How many digits a ``Decimal`` may have before its point (unlimited without
    ``max_digits``)."""
    return float("inf") if max_digits is None else max_digits - (decimal_places or 0)


def _dedupe(gaps: list[Gap]) -> list[Gap]:
    return list(dict.fromkeys(gaps))


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _json(value: object) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _ref(node: Any) -> str | None:
    if isinstance(node, dict) and isinstance(node.get("$ref"), str):
        return str(node["$ref"])
    return None


def _resolve(node: Any, root: SchemaDocument) -> dict[str, Any]:
    """``node`` with its local ``$ref`` replaced by the definition (its other keys kept)."""
    if not isinstance(node, dict):
        return {"not": {}} if node is False else {}
    resolved: dict[str, Any] = node
    seen: set[str] = set()
    while isinstance(resolved.get("$ref"), str) and resolved["$ref"] not in seen:
        ref = resolved["$ref"]
        seen.add(ref)
        target: Any = root if ref.startswith("#/") else None
        for part in ref.removeprefix("#/").split("/"):
            target = target.get(part) if isinstance(target, dict) else None
        rest = {k: v for k, v in resolved.items() if k != "$ref"}
        resolved = {**(target if isinstance(target, dict) else {}), **rest, _RESOLVED_FROM: ref}
    return resolved


def _branches(node: Any, root: SchemaDocument) -> list[dict[str, Any]]:
    """The alternatives of a node (``anyOf``/``oneOf``, a list of types), each carrying the
    keys of the node around it that constrain values (a ``Decimal``'s precision)."""
    node = _resolve(node, root)
    for key in ("anyOf", "oneOf"):
        if isinstance(node.get(key), list):
            around = {k: v for k, v in node.items() if k not in (key, *_ANNOTATIONS)}
            found: list[dict[str, Any]] = []
            for branch in node[key]:
                found += _branches({**_resolve(branch, root), **around}, root)
            return found
    if isinstance(node.get("allOf"), list) and len(node["allOf"]) == 1:
        rest = {k: v for k, v in node.items() if k != "allOf"}
        return _branches({**_resolve(node["allOf"][0], root), **rest}, root)
    if isinstance(node.get("type"), list):
        return [{**node, "type": kind} for kind in node["type"]]
    return [node]


def _values(node: dict[str, Any]) -> list[Any] | None:
    """The values an ``enum`` or ``const`` allows, or ``None`` when the node is open."""
    if "const" in node:
        return [node["const"]]
    if isinstance(node.get("enum"), list):
        return list(node["enum"])
    return None


def _kind(node: dict[str, Any]) -> str:
    """The JSON type a branch accepts (``any`` when it does not say)."""
    if isinstance(node.get("type"), str):
        return str(node["type"])
    values = _values(node)
    if values:
        return _json_kind(values[0])
    if node.get("not") == {}:
        return "never"
    if "properties" in node or "additionalProperties" in node:
        return "object"
    if "items" in node or "prefixItems" in node:
        return "array"
    return "any"


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "string"


def _kinds_meet(reader: dict[str, Any], writer: dict[str, Any]) -> bool:
    """Whether a reader's branch may accept some of a writer's branch: the same JSON type (an
    integer is a number too)."""
    reader_kind, writer_kind = _kind(reader), _kind(writer)
    if reader_kind == writer_kind:
        return True
    return reader_kind == "number" and writer_kind == "integer"


def _bound(node: dict[str, Any], inclusive: str, exclusive: str) -> tuple[float, bool] | None:
    """The tighter of a node's inclusive and exclusive bound on one side: (value, exclusive)."""
    found = [(float(node[inclusive]), False)] if inclusive in node else []
    found += [(float(node[exclusive]), True)] if exclusive in node else []
    if not found:
        return None
    if inclusive.startswith("min"):
        return max(found, key=lambda bound: (bound[0], bound[1]))
    return min(found, key=lambda bound: (bound[0], not bound[1]))


def describe(node: Any, root: SchemaDocument, depth: int = 0) -> str:
    """A short name for what a node accepts: ``integer | null``, ``one of "a", "b"``,
    ``array of Line``…"""
    ref = _ref(node)
    if ref and depth > 0:
        return ref.rsplit("/", 1)[-1]
    branches = _branches(node, root)
    names = [_describe_branch(branch, root, depth) for branch in branches]
    return " | ".join(unique(names)) or "nothing"


def _describe_branch(node: dict[str, Any], root: SchemaDocument, depth: int) -> str:
    values = _values(node)
    if values is not None:
        return (
            "one of " + ", ".join(_json(v) for v in values) if len(values) > 1 else _json(values[0])
        )
    kind = _kind(node)
    if kind == "array" and depth < 2:
        if "prefixItems" in node:
            inner = ", ".join(describe(item, root, depth + 1) for item in node["prefixItems"])
            return f"tuple of ({inner})"
        return f"array of {describe(node.get('items', {}), root, depth + 1)}"
    if kind == "object" and isinstance(node.get("additionalProperties"), dict) and depth < 2:
        return f"object of {describe(node['additionalProperties'], root, depth + 1)}"
    if kind == "object" and node.get("title"):
        return str(node["title"])
    if MAX_DIGITS_KEY in node or DECIMAL_PLACES_KEY in node:
        return "decimal"
    if node.get("format"):
        return f"{kind} ({node['format']})"
    return kind


def unique(texts: Iterable[str]) -> list[str]:
    """``texts`` without repeats, in order."""
    return list(dict.fromkeys(texts))
