"""Which changes of an event are compatible, in Confluent Schema Registry's terms.

Services that share events deploy at different times, and records outlive deploys (the outbox's
backlog, a topic's retention, a dead-letter topic replayed weeks later). A change of an event
model is judged by who can still read what (docs/schemas.md has the table):

``BACKWARD``
    The new reader reads data of the old schema: consumers may deploy first, and records
    written before the change stay readable.
``FORWARD``
    The old reader reads data of the new schema: producers may deploy first.
``FULL``
    Both. The default of ``outboxkit schemas check``: a rolling deploy runs old and new
    instances of a service side by side, so both directions happen even when one team owns
    both ends, and a producer and its consumers are released in either order.
``*_TRANSITIVE``
    The same against every version kept in the snapshot, not only each type's latest (see
    below).

What is compared. A *snapshot* (:mod:`outboxkit.schemas.compat.snapshot`) is the JSON Schema of each
``(type, version)`` exported earlier; the *current* side is the registry. Records carry their
``(type, version)`` and a reader decodes each with the model of that version (or an upcaster
chain to a newer one), so:

- every ``(type, version)`` in both is compared field by field, in every mode: a version still
  registered is still written and read;
- a version the snapshot has and the registry cannot read any more (no model, no upcaster
  chain) breaks ``BACKWARD``, the latest or an older one: the snapshot keeps every version
  until ``outboxkit schemas export --prune`` says its records are gone (BACKWARD_TRANSITIVE's
  semantics for the versions it keeps);
- a version read through an upcaster, a version added, a default changed and ``strict_reader``
  switched are *notes*: worth a line, breaking no mode (the check cannot see what an upcaster
  returns, nor whether producers write the new version yet);
- ``FORWARD_TRANSITIVE`` asks nothing more than ``FORWARD`` of one snapshot (a version dropped
  stops no old reader); to check against older releases, run the check against their
  snapshots as well.

How one schema is compared. Readers are *tolerant*: a field the reader does not declare is
ignored, at every level, unless the event type says ``strict_reader=True`` (then a model that
forbids unknown fields rejects it). Writers write every field, defaults included, so a field
is absent from a record only when the record is older than the field: the old schema's
optional fields may be missing from old records, the new schema's are all present in new
ones. Types are compared as JSON Schema (``anyOf``, ``$ref``, ``enum``/``const``, ``format``,
``items``/``prefixItems``, ``additionalProperties``, the numeric, length and pattern
constraints): a change that shrinks what a schema accepts is a narrowing, one that grows it a
widening. A renamed field is a field removed and a field added.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from outboxkit.core.words import counted
from outboxkit.schemas.compat.schema_walk import Direction, Gap, Walk, unique
from outboxkit.schemas.compat.snapshot import (
    KEY_FIELD_KEY,
    STRICT_READER_KEY,
    TOPIC_KEY,
    TYPE_KEY,
    VERSION_KEY,
    SchemaDocument,
    Snapshot,
    annotated_form,
)
from outboxkit.schemas.registry import EventRegistry


class CompatibilityMode(StrEnum):
    """Who must be able to read what (the module says it in full)."""

    BACKWARD = "backward"
    FORWARD = "forward"
    FULL = "full"
    BACKWARD_TRANSITIVE = "backward_transitive"
    FORWARD_TRANSITIVE = "forward_transitive"
    FULL_TRANSITIVE = "full_transitive"


DEFAULT_MODE = CompatibilityMode.FULL

_Mode = CompatibilityMode
_BACKWARD_MODES = frozenset(
    {_Mode.BACKWARD, _Mode.FULL, _Mode.BACKWARD_TRANSITIVE, _Mode.FULL_TRANSITIVE}
)
_FORWARD_MODES = frozenset(
    {_Mode.FORWARD, _Mode.FULL, _Mode.FORWARD_TRANSITIVE, _Mode.FULL_TRANSITIVE}
)
_EVERY_MODE = frozenset(_Mode)
_NO_MODE: frozenset[CompatibilityMode] = frozenset()


class Rule(StrEnum):
    """The kinds of change the check tells apart; :data:`ADVICE` says what to do instead."""

    REQUIRED_FIELD_ADDED = "required_field_added"
    FIELD_ADDED = "field_added"
    REQUIRED_FIELD_REMOVED = "required_field_removed"
    FIELD_REMOVED = "field_removed"
    FIELD_BECAME_REQUIRED = "field_became_required"
    TYPE_WIDENED = "type_widened"
    TYPE_NARROWED = "type_narrowed"
    TYPE_CHANGED = "type_changed"
    ENUM_VALUE_ADDED = "enum_value_added"
    ENUM_VALUE_REMOVED = "enum_value_removed"
    ENUM_VALUES_CHANGED = "enum_values_changed"
    CONSTRAINT_LOOSENED = "constraint_loosened"
    CONSTRAINT_TIGHTENED = "constraint_tightened"
    CONSTRAINT_CHANGED = "constraint_changed"
    DECIMAL_PRECISION_WIDENED = "decimal_precision_widened"
    DECIMAL_PRECISION_NARROWED = "decimal_precision_narrowed"
    DECIMAL_PRECISION_CHANGED = "decimal_precision_changed"
    KEY_FIELD_CHANGED = "key_field_changed"
    TOPIC_CHANGED = "topic_changed"
    VERSION_REMOVED = "version_removed"
    VERSION_UPCAST = "version_upcast"
    VERSION_ADDED = "version_added"
    DEFAULT_CHANGED = "default_changed"
    STRICT_READER_CHANGED = "strict_reader_changed"


_CONSUMERS_FIRST = (
    "release it to every consumer before any producer writes the new values (the change is "
    "backward compatible: gate that release with --mode backward)"
)
_UPCAST_OLD_VALUES = (
    "bump the version and register an upcaster that maps the old values (or check the rule "
    "where the event is written, not in the model)"
)
_NEW_NAME = (
    "add a field under a new name (with a default) instead, or bump the version and register "
    "an upcaster"
)

ADVICE: dict[Rule, str] = {
    Rule.REQUIRED_FIELD_ADDED: (
        "give it a default, or bump the version and register an upcaster that fills it in"
    ),
    Rule.FIELD_ADDED: (
        "release it to the strict consumers first, or let them read tolerantly "
        "(strict_reader=False)"
    ),
    Rule.REQUIRED_FIELD_REMOVED: (
        "give it a default first and release that to every consumer; remove it in a later release"
    ),
    Rule.FIELD_REMOVED: (
        "keep declaring it on the strict reader, or let it read tolerantly (strict_reader=False)"
    ),
    Rule.FIELD_BECAME_REQUIRED: "keep its default",
    Rule.TYPE_WIDENED: _CONSUMERS_FIRST,
    Rule.TYPE_NARROWED: _UPCAST_OLD_VALUES,
    Rule.TYPE_CHANGED: _NEW_NAME,
    Rule.ENUM_VALUE_ADDED: _CONSUMERS_FIRST,
    Rule.ENUM_VALUE_REMOVED: _UPCAST_OLD_VALUES,
    Rule.ENUM_VALUES_CHANGED: _NEW_NAME,
    Rule.CONSTRAINT_LOOSENED: _CONSUMERS_FIRST,
    Rule.CONSTRAINT_TIGHTENED: _UPCAST_OLD_VALUES,
    Rule.CONSTRAINT_CHANGED: _NEW_NAME,
    Rule.DECIMAL_PRECISION_WIDENED: _CONSUMERS_FIRST,
    Rule.DECIMAL_PRECISION_NARROWED: (
        "bump the version and register an upcaster that rounds the old amounts"
    ),
    Rule.DECIMAL_PRECISION_CHANGED: (
        "grow max_digits with decimal_places (then it only widens), or bump the version and "
        "register an upcaster"
    ),
    Rule.KEY_FIELD_CHANGED: (
        "publish a new event type keyed by the new field; consumers handle both while records "
        "of the old one drain"
    ),
    Rule.TOPIC_CHANGED: "publish a new event type on the new topic",
    Rule.VERSION_REMOVED: (
        "keep its model registered, or register an upcaster from it, until no topic, outbox "
        "or dead-letter topic holds records of it"
    ),
    Rule.VERSION_UPCAST: (
        "test the upcaster on records of this version (the snapshot's schema describes them)"
    ),
    Rule.VERSION_ADDED: "write it only once every consumer is deployed with this registry",
    Rule.DEFAULT_CHANGED: "nothing, if meant: consumers see both values from now on",
    Rule.STRICT_READER_CHANGED: (
        "with strict_reader=True, release each added field to the consumers before the producers"
    ),
}

#: A family of field changes, by the directions in which it breaks.
_BY_DIRECTIONS: dict[str, dict[frozenset[Direction], Rule]] = {
    "type": {
        frozenset({"backward"}): Rule.TYPE_NARROWED,
        frozenset({"forward"}): Rule.TYPE_WIDENED,
        frozenset({"backward", "forward"}): Rule.TYPE_CHANGED,
    },
    "enum": {
        frozenset({"backward"}): Rule.ENUM_VALUE_REMOVED,
        frozenset({"forward"}): Rule.ENUM_VALUE_ADDED,
        frozenset({"backward", "forward"}): Rule.ENUM_VALUES_CHANGED,
    },
    "constraint": {
        frozenset({"backward"}): Rule.CONSTRAINT_TIGHTENED,
        frozenset({"forward"}): Rule.CONSTRAINT_LOOSENED,
        frozenset({"backward", "forward"}): Rule.CONSTRAINT_CHANGED,
    },
    "decimal": {
        frozenset({"backward"}): Rule.DECIMAL_PRECISION_NARROWED,
        frozenset({"forward"}): Rule.DECIMAL_PRECISION_WIDENED,
        frozenset({"backward", "forward"}): Rule.DECIMAL_PRECISION_CHANGED,
    },
}


@dataclass(frozen=True)
class Finding:
    """One change of one ``(type, version)``: where (``path``, e.g. ``items[].sku``; empty for
    the event as a whole), what changed, why it matters, the modes it breaks (none: a note)
    and what to do instead."""

    event_type: str
    version: int
    path: str
    rule: Rule
    change: str
    why: str
    breaks: frozenset[CompatibilityMode]

    @property
    def advice(self) -> str:
        return ADVICE[self.rule]

    def breaks_mode(self, mode: CompatibilityMode) -> bool:
        return mode in self.breaks

    @property
    def where(self) -> str:
        label = f"{self.event_type} v{self.version}"
        return f"{label} {self.path}" if self.path else label

    def lines(self) -> list[str]:
        """What a person reads: where and what, why, and what to do instead."""
        rule = self.rule.value.replace("_", " ")
        head = f"{self.where}: {rule} ({self.change})"
        if self.breaks:
            head += f" — breaks {_breaks_label(self.breaks)}"
        return [head, f"  {self.why}", f"  → {self.advice}"]

    def as_dict(self) -> dict[str, Any]:
        return {
            "type": self.event_type,
            "version": self.version,
            "path": self.path,
            "rule": self.rule.value,
            "change": self.change,
            "why": self.why,
            "breaks": sorted(mode.value for mode in self.breaks),
            "advice": self.advice,
        }


def _breaks_label(breaks: frozenset[CompatibilityMode]) -> str:
    if breaks == _EVERY_MODE:
        return "every mode"
    named = []
    if _Mode.BACKWARD in breaks:
        named.append("BACKWARD")
    elif _Mode.BACKWARD_TRANSITIVE in breaks:
        named.append("BACKWARD_TRANSITIVE")
    if _Mode.FORWARD in breaks:
        named.append("FORWARD")
    return " and ".join(named)


@dataclass(frozen=True)
class CompatibilityReport:
    """The findings of a check in one mode: those that break it, and the notes (the rest)."""

    mode: CompatibilityMode
    findings: tuple[Finding, ...]
    event_types: int
    versions: int

    @property
    def breaking(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.breaks_mode(self.mode))

    @property
    def notes(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if not f.breaks_mode(self.mode))

    @property
    def compatible(self) -> bool:
        return not self.breaking

    def lines(self) -> list[str]:
        """The report as a person reads it: each breaking change, then the notes."""
        mode = self.mode.value.upper()
        lines = []
        if self.breaking:
            lines.append(f"{len(self.breaking)} change(s) break {mode} compatibility:")
            for finding in self.breaking:
                lines += [f"  {line}" for line in finding.lines()]
        else:
            lines.append(
                f"compatible: {counted(self.event_types, 'type')}, "
                f"{counted(self.versions, 'version')} checked ({mode})"
            )
        for finding in self.notes:
            lines += [f"note: {finding.lines()[0]}", *finding.lines()[1:]]
        return lines

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode.value,
            "compatible": self.compatible,
            "types": self.event_types,
            "versions": self.versions,
            "breaking": [f.as_dict() for f in self.breaking],
            "notes": [f.as_dict() for f in self.notes],
        }


def check_compatibility(
    current: EventRegistry | Snapshot,
    against: Snapshot,
    mode: CompatibilityMode | str = DEFAULT_MODE,
) -> CompatibilityReport:
    """Compare ``current`` (a registry, or a snapshot of one) with the snapshot ``against``
    (exported earlier) in ``mode``."""
    mode = CompatibilityMode(mode)
    new = current if isinstance(current, Snapshot) else Snapshot.of_registry(current)
    findings = compare_snapshots(against, new)
    slots = set(against.documents) | set(new.documents)
    return CompatibilityReport(mode, tuple(findings), len({t for t, _ in slots}), len(slots))


def compare_snapshots(old: Snapshot, new: Snapshot) -> list[Finding]:
    """Every finding between two snapshots, whatever the mode (each says what it breaks)."""
    findings: list[Finding] = []
    for event_type in sorted(set(old.event_types()) | set(new.event_types())):
        old_versions, new_versions = old.versions(event_type), new.versions(event_type)
        readable = new.readable_versions(event_type)
        for version in old_versions:
            old_doc = old.annotated[event_type, version]
            if version in new_versions:
                findings += compare_event_schemas(old_doc, new.annotated[event_type, version])
            elif version in readable:
                findings.append(_version_finding(event_type, version, Rule.VERSION_UPCAST))
            else:
                latest = version == old_versions[-1]
                findings.append(_version_removed(event_type, version, latest=latest))
        for version in new_versions:
            if version in old_versions:
                continue
            findings.append(_version_finding(event_type, version, Rule.VERSION_ADDED))
            if old_versions:  # a new version of a known type: the same key and topic
                previous = old.annotated[event_type, old_versions[-1]]
                findings += _routing(previous, new.annotated[event_type, version])
    return findings


def compare_event_schemas(old: SchemaDocument, new: SchemaDocument) -> list[Finding]:
    """Every finding between two schemas of one ``(type, version)``, whatever the mode (each
    as its file holds it, or annotated)."""
    old, new = annotated_form(old), annotated_form(new)
    gaps = [
        *Walk(reader=new, writer=old, direction="backward").gaps(),
        *Walk(reader=old, writer=new, direction="forward").gaps(),
    ]
    event_type, version = _slot(new)
    findings = list(_merge(gaps, event_type, version))
    findings += _routing(old, new)
    if bool(old.get(STRICT_READER_KEY)) != bool(new.get(STRICT_READER_KEY)):
        now = bool(new.get(STRICT_READER_KEY))
        findings.append(
            Finding(
                event_type,
                version,
                "",
                Rule.STRICT_READER_CHANGED,
                f"strict_reader {not now} → {now}",
                "readers now reject fields they do not declare"
                if now
                else "readers now ignore fields they do not declare",
                _NO_MODE,
            )
        )
    return findings


def _slot(document: SchemaDocument) -> tuple[str, int]:
    return str(document.get(TYPE_KEY, "?")), int(document.get(VERSION_KEY, 0))


def _routing(old: SchemaDocument, new: SchemaDocument) -> list[Finding]:
    """The key field and the topic: a change splits one entity's records over partitions or
    topics, so their order is lost in every mode."""
    event_type, version = _slot(new)
    found = []
    for key, rule, why in (
        (
            KEY_FIELD_KEY,
            Rule.KEY_FIELD_CHANGED,
            "one entity's records go to other partitions: their order is lost across the change",
        ),
        (
            TOPIC_KEY,
            Rule.TOPIC_CHANGED,
            "consumers of the old topic stop receiving it, and order across the two topics is lost",
        ),
    ):
        if old.get(key) != new.get(key):
            change = f"{old.get(key)!r} → {new.get(key)!r}"
            found.append(Finding(event_type, version, "", rule, change, why, _EVERY_MODE))
    return found


def _version_finding(event_type: str, version: int, rule: Rule) -> Finding:
    why = {
        Rule.VERSION_UPCAST: "no model of it is registered; an upcaster chain reads it",
        Rule.VERSION_ADDED: "readers deployed from the snapshot reject it (unsupported_version)",
    }[rule]
    change = "read through an upcaster" if rule is Rule.VERSION_UPCAST else "new version"
    return Finding(event_type, version, "", rule, change, why, _NO_MODE)


def _version_removed(event_type: str, version: int, *, latest: bool) -> Finding:
    which = "its latest version in the snapshot" if latest else "an older version"
    return Finding(
        event_type,
        version,
        "",
        Rule.VERSION_REMOVED,
        f"no model or upcaster reads it ({which})",
        "its records still in a topic, an outbox or a dead-letter topic cannot be decoded "
        "(unsupported_version)",
        _BACKWARD_MODES,
    )


def _merge(gaps: Sequence[Gap], event_type: str, version: int) -> Iterator[Finding]:
    """One finding per path and family, breaking the modes of each direction it was seen in."""
    grouped: dict[tuple[str, str], list[Gap]] = {}
    for gap in gaps:
        grouped.setdefault((gap.path, gap.family), []).append(gap)
    for (path, family), group in grouped.items():
        directions = frozenset(gap.direction for gap in group)
        if family in _BY_DIRECTIONS:
            rule = _BY_DIRECTIONS[family][directions]
        elif family == "added":
            required = any(gap.required for gap in group)
            rule = Rule.REQUIRED_FIELD_ADDED if required else Rule.FIELD_ADDED
        elif family == "removed":
            required = any(gap.required for gap in group)
            rule = Rule.REQUIRED_FIELD_REMOVED if required else Rule.FIELD_REMOVED
        elif family == "became_required":
            rule = Rule.FIELD_BECAME_REQUIRED
        else:
            first = group[0]
            yield Finding(
                event_type, version, path, Rule.DEFAULT_CHANGED, first.change, first.why, _NO_MODE
            )
            continue
        breaks: set[CompatibilityMode] = set()
        if "backward" in directions:
            breaks |= _BACKWARD_MODES
        if "forward" in directions:
            breaks |= _FORWARD_MODES
        yield Finding(
            event_type,
            version,
            path,
            rule,
            "; ".join(unique(gap.change for gap in group)),
            "; ".join(unique(gap.why for gap in group)),
            frozenset(breaks),
        )
