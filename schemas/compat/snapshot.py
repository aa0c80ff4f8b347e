"""An event registry written down: one JSON Schema per ``(type, version)``, to commit and diff.

A :class:`Snapshot` holds the JSON Schema of each event's payload — what the record value holds
(the wire format, :mod:`outboxkit.schemas.wire`), the envelope fields left out — as pydantic
describes it for validation (what a reader accepts), plus what is not in pydantic's schema and
decides whether a change is compatible, as annotations at the top of each document:

==================================  ===============================================================
``x-outboxkit-ce-type``             the event type (``ce_type``)
``x-outboxkit-ce-schemaversion``    its version (``ce_schemaversion``)
``x-outboxkit-key-field``           the payload field the Kafka key comes from (or ``null``)
``x-outboxkit-topic``               the default topic (or ``null``)
``x-outboxkit-strict-reader``       whether a reader rejects the fields it does not declare
==================================  ===============================================================

and, on each ``Decimal``, ``x-outboxkit-max-digits`` and ``x-outboxkit-decimal-places`` (pydantic
keeps those two constraints out of its JSON Schema). The text of a document is stable (sorted
keys, two-space indents, a final newline): exporting an unchanged registry changes no file.

Pure, like the rest of the package: :meth:`Snapshot.files` gives the files' names and texts, and
:meth:`Snapshot.from_files` takes them back; the command (``outboxkit schemas``) and the pytest
helper (:mod:`outboxkit.testing.schemas`) read and write the directory.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from outboxkit.core.exceptions import ConfigurationError
from outboxkit.schemas.event import ENVELOPE_FIELDS, Event
from outboxkit.schemas.exceptions import SchemaError
from outboxkit.schemas.registry import EventRegistry

SchemaDocument = dict[str, Any]
"""A JSON Schema document, as :func:`json.loads` gives it."""

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
TYPE_KEY = "x-outboxkit-ce-type"
VERSION_KEY = "x-outboxkit-ce-schemaversion"
KEY_FIELD_KEY = "x-outboxkit-key-field"
TOPIC_KEY = "x-outboxkit-topic"
STRICT_READER_KEY = "x-outboxkit-strict-reader"
MAX_DIGITS_KEY = "x-outboxkit-max-digits"
DECIMAL_PLACES_KEY = "x-outboxkit-decimal-places"

SlotKey = tuple[str, int]
"""``(event type, version)``."""


class _PayloadSchemaGenerator(GenerateJsonSchema):
    """pydantic's JSON Schema, with the ``Decimal`` constraints a reader enforces written down."""

    def decimal_schema(self, schema: core_schema.DecimalSchema) -> JsonSchemaValue:
        json_schema = super().decimal_schema(schema)
        digits, places = schema.get("max_digits"), schema.get("decimal_places")
        if digits is not None:
            json_schema[MAX_DIGITS_KEY] = digits
        if places is not None:
            json_schema[DECIMAL_PLACES_KEY] = places
        for branch in json_schema.get("anyOf", ()):
            if branch.get("type") == "string":  # the form writers send: str(Decimal)
                branch["pattern"] = decimal_pattern(digits, places)
        return json_schema


def decimal_pattern(max_digits: int | None, decimal_places: int | None) -> str:
    """A regular expression (ECMA-262 and Python alike) for the text a writer sends of a
    ``Decimal(max_digits, decimal_places)`` (``str(value)``): at most ``decimal_places`` places
    and ``max_digits`` digits, counted as pydantic counts them (leading zeros and the
    fraction's trailing zeros do not count). The exponent form (``1E+2``, ``1E-7``, what
    ``str`` writes of such values) is checked for its form only, and the reader's lax forms
    (``.5``, ``+1``, ``1_000``, surrounding spaces) are not matched: docs/schemas.md."""

    def whole(at_most: int | None) -> str:
        if at_most is None:
            return "(?:0|[1-9][0-9]*)"
        return "0" if at_most <= 0 else f"(?:0|[1-9][0-9]{{0,{at_most - 1}}})"

    if decimal_places is not None:
        fraction = r"(?:\.0+)?" if decimal_places == 0 else rf"(?:\.[0-9]{{1,{decimal_places}}}0*)?"
        whole_digits = None if max_digits is None else max_digits - decimal_places
        plain = whole(whole_digits) + fraction
        if whole_digits == 0:  # pydantic counts a zero before the point then: 0.05, never 0
            plain = rf"0\.[0-9]{{0,{decimal_places - 1}}}[1-9]0*"
    elif max_digits is not None:  # digits before and after the point share the bound
        plain = (
            "(?:"
            + "|".join(
                [whole(max_digits) + r"(?:\.0+)?"]
                + [whole(max_digits - k) + rf"\.[0-9]{{{k}}}0*" for k in range(1, max_digits + 1)]
            )
            + ")"
        )
    else:
        plain = whole(None) + r"(?:\.[0-9]+)?"
    exponent = r"[0-9](?:\.[0-9]+)?E[+-][0-9]+"
    return f"^-?(?:{plain}|{exponent})$"


def payload_schema(event_cls: type[Event]) -> SchemaDocument:
    """The annotated JSON Schema of ``event_cls``' payload (see the module)."""
    try:
        document = event_cls.model_json_schema(
            mode="validation", schema_generator=_PayloadSchemaGenerator
        )
    except Exception as exc:  # pydantic refuses some types (callables…); say which event
        raise SchemaError(
            f"{event_cls.event_type} v{event_cls.event_version} "
            f"({event_cls.__module__}.{event_cls.__qualname__}) cannot be written as JSON "
            f"Schema: {exc}"
        ) from exc
    properties = document.get("properties", {})
    for name in ENVELOPE_FIELDS:
        properties.pop(name, None)
    required = [name for name in document.get("required", []) if name not in ENVELOPE_FIELDS]
    if required:
        document["required"] = required
    else:
        document.pop("required", None)
    if not event_cls.event_strict_reader:
        _open_objects(document)
    document["$schema"] = JSON_SCHEMA_DIALECT
    document["$id"] = event_cls.event_dataschema  # what each record's ce_dataschema names
    document[TYPE_KEY] = event_cls.event_type
    document[VERSION_KEY] = event_cls.event_version
    document[KEY_FIELD_KEY] = event_cls.event_key_field
    document[TOPIC_KEY] = event_cls.event_topic
    document[STRICT_READER_KEY] = event_cls.event_strict_reader
    return document


#: JSON Schema's keywords whose value is a schema, a list of schemas, or a map of them (the
#: map's keys are field names: data). Nothing else of a document is walked.
_ONE_SCHEMA = (
    "items",
    "additionalProperties",
    "not",
    "contains",
    "propertyNames",
    "if",
    "then",
    "else",
)
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "$defs", "patternProperties", "dependentSchemas")


def _open_objects(schema: Any) -> None:
    """Drop ``additionalProperties: false`` (a model that forbids unknown fields) from every
    object of ``schema``, walked by JSON Schema's grammar: a tolerant reader ignores the fields
    it does not declare, at every level, so the schema that ``ce_dataschema`` names accepts a
    record with a field a newer producer added, as the reader does. A strict reader's document
    stays closed."""
    if not isinstance(schema, dict):
        return
    if schema.get("additionalProperties") is False:
        del schema["additionalProperties"]
    for key in _ONE_SCHEMA:
        _open_objects(schema.get(key))
    for key in _SCHEMA_LISTS:
        for sub in schema.get(key) or ():
            _open_objects(sub)
    for key in _SCHEMA_MAPS:
        for sub in (schema.get(key) or {}).values():
            _open_objects(sub)


def schema_filename(event_type: str, version: int) -> str:
    """``<type>.v<version>.json``; characters a file name cannot hold are %-escaped."""
    return f"{quote(event_type, safe='')}.v{version}.json"


def render(document: SchemaDocument) -> str:
    """The stable text of a document: sorted keys, two-space indents, a final newline."""
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


@dataclass(frozen=True)
class Snapshot:
    """The payload schemas of a set of event types, by ``(type, version)``, and for each type
    the versions a reader of it decodes (a registry's upcasters add versions it has no model
    of; a snapshot read from files decodes the versions it has)."""

    documents: Mapping[SlotKey, SchemaDocument]
    readable: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    @classmethod
    def of_registry(cls, registry: EventRegistry) -> Snapshot:
        documents = {
            (model.event_type, model.event_version): payload_schema(model) for model in registry
        }
        types = {event_type for event_type, _ in documents}
        return cls(documents, {name: registry.readable_versions(name) for name in types})

    @classmethod
    def from_documents(cls, documents: Iterable[SchemaDocument]) -> Snapshot:
        """The snapshot of these documents (each as :func:`payload_schema` gives it)."""
        return cls.from_files({f"document {i}": render(doc) for i, doc in enumerate(documents)})

    @classmethod
    def from_files(cls, files: Mapping[str, str]) -> Snapshot:
        """The snapshot in ``files`` (name → text of each ``.json`` file of a directory).

        Raises :class:`ConfigurationError` naming the file that is not JSON, not a schema
        ``outboxkit schemas export`` wrote, or a second schema of one ``(type, version)``."""
        found: dict[SlotKey, SchemaDocument] = {}
        origin: dict[SlotKey, str] = {}
        for name in sorted(files):
            try:
                document = json.loads(files[name])
            except ValueError as exc:
                raise ConfigurationError(f"{name}: not JSON ({exc})") from None
            slot = _slot_of(document)
            if slot is None:
                raise ConfigurationError(
                    f"{name}: not an event schema that `outboxkit schemas export` wrote "
                    f"(no {TYPE_KEY} and {VERSION_KEY}); move it out of the directory"
                )
            if slot in found:
                raise ConfigurationError(
                    f"{name} and {origin[slot]} both describe {slot[0]} v{slot[1]}; keep one"
                )
            found[slot], origin[slot] = document, name
        return cls(found)

    def files(self) -> dict[str, str]:
        """Each document's file name and text."""
        return {
            schema_filename(*slot): render(document)
            for slot, document in sorted(self.documents.items())
        }

    def event_types(self) -> list[str]:
        return sorted({event_type for event_type, _ in self.documents})

    def versions(self, event_type: str) -> tuple[int, ...]:
        return tuple(sorted(v for name, v in self.documents if name == event_type))

    def readable_versions(self, event_type: str) -> tuple[int, ...]:
        return self.readable.get(event_type, self.versions(event_type))

    def __len__(self) -> int:
        return len(self.documents)


def _slot_of(document: object) -> SlotKey | None:
    if not isinstance(document, dict):
        return None
    event_type, version = document.get(TYPE_KEY), document.get(VERSION_KEY)
    if not isinstance(event_type, str) or not event_type:
        return None
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        return None
    return event_type, version


def snapshot_slot(text: str) -> SlotKey | None:
    """The ``(type, version)`` of a schema ``outboxkit schemas export`` wrote, or ``None`` for
    any other text (export leaves such files alone)."""
    try:
        return _slot_of(json.loads(text))
    except ValueError:
        return None
