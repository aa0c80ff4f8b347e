"""An event registry written down: one JSON Schema per ``(type, version)``, to commit and diff.

A :class:`Snapshot` holds the JSON Schema of each event's payload — what the record value holds
(the wire format, :mod:`outboxkit.schemas.wire`), the envelope fields left out — as pydantic
describes it for validation (what a reader accepts), plus what is not in pydantic's schema and
decides whether a change is compatible. A file keeps that in a place every validator accepts
(Ajv's strict mode refuses keywords it does not know): the ``const`` of the ``$defs`` member
``x-outboxkit``, a schema no ``$ref`` names, which accepts that one value and nothing else::

    "$defs": {"x-outboxkit": {"description": "...", "const": {
        "ce-type": "shop.order_placed",     the event type (ce_type)
        "ce-schemaversion": 1,              its version (ce_schemaversion)
        "key-field": "order_id",            the payload field the Kafka key comes from (or null)
        "topic": "shop.orders",             the default topic (or null)
        "strict-reader": false,             whether a reader rejects the fields it does not declare
        "decimals": {"/properties/amount": {"max-digits": 10, "decimal-places": 2}}
    }}}

``decimals`` gives, by JSON Pointer, the precision of each ``Decimal`` (pydantic keeps those two
constraints out of its JSON Schema; the string form's ``pattern`` bounds them). In memory, and in
files exported before that form (which are still read), the same facts are keywords:
``x-outboxkit-ce-type``, ``x-outboxkit-ce-schemaversion``, ``x-outboxkit-key-field``,
``x-outboxkit-topic`` and ``x-outboxkit-strict-reader`` at the top, ``x-outboxkit-max-digits``
and ``x-outboxkit-decimal-places`` on each ``Decimal``: :func:`annotated_form` and
:func:`exported_form` turn one into the other. The text of a document is stable (sorted keys,
two-space indents, a final newline): exporting an unchanged registry changes no file.

Pure, like the rest of the package: :meth:`Snapshot.files` gives the files' names and texts, and
:meth:`Snapshot.from_files` takes them back; the command (``outboxkit schemas``) and the pytest
helper (:mod:`outboxkit.testing.schemas`) read and write the directory.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import quote

from pydantic.json_schema import GenerateJsonSchema, JsonSchemaMode, JsonSchemaValue
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

#: The ``$defs`` member of an exported file whose ``const`` holds outboxkit's facts.
METADATA_DEF = "x-outboxkit"
_METADATA_DESCRIPTION = (
    "outboxkit's description of the event (what `outboxkit schemas check` compares), not a "
    "schema of the payload: no $ref names it"
)
#: The document's keys in memory → their names in the file's metadata.
_DOCUMENT_FACTS = {
    TYPE_KEY: "ce-type",
    VERSION_KEY: "ce-schemaversion",
    KEY_FIELD_KEY: "key-field",
    TOPIC_KEY: "topic",
    STRICT_READER_KEY: "strict-reader",
}
_DECIMAL_FACTS = {MAX_DIGITS_KEY: "max-digits", DECIMAL_PLACES_KEY: "decimal-places"}

SlotKey = tuple[str, int]
"""``(event type, version)``."""


class _PayloadSchemaGenerator(GenerateJsonSchema):
    """pydantic's JSON Schema, with the ``Decimal`` constraints a reader enforces written down,
    and the defaults kept as they are: pydantic rewrites ``$ref`` and ``$defs`` keys wherever
    they are in the document when it renames its definitions, a default's data too (a default
    ``{"$defs": 1}`` of a field failed the export, one with ``"$ref"`` would change), so each
    default stands as a token until then."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._defaults: dict[str, Any] = {}

    def encode_default(self, dft: Any) -> Any:
        token = f"\x00outboxkit-default-{len(self._defaults)}"
        self._defaults[token] = super().encode_default(dft)
        return token

    def generate(
        self, schema: core_schema.CoreSchema, mode: JsonSchemaMode = "validation"
    ) -> JsonSchemaValue:
        return cast(JsonSchemaValue, _put_back(super().generate(schema, mode), self._defaults))

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

    def datetime_schema(self, schema: core_schema.DatetimeSchema) -> JsonSchemaValue:
        """A ``datetime`` that may be naive: the writer writes a naive one without an offset,
        which ``format: date-time`` (RFC 3339) refuses, so a pattern says it instead."""
        json_schema = super().datetime_schema(schema)
        constraint = schema.get("tz_constraint")
        if constraint == "aware" or isinstance(constraint, int):
            return json_schema  # RFC 3339's date-time, with its offset
        json_schema.pop("format", None)
        json_schema["pattern"] = NAIVE_DATETIME if constraint == "naive" else ANY_DATETIME
        return json_schema


_DATE_TIME = (
    r"[0-9]{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])[Tt ](?:[01][0-9]|2[0-3]):[0-5][0-9]"
    r"(?::[0-5][0-9](?:\.[0-9]+)?)?"
)
#: A ``datetime`` with or without an offset: the form a writer sends (``2024-05-01T12:00:00``,
#: ``2024-05-01T12:00:00.5+02:00``), RFC 3339's, and the reader's other separators.
ANY_DATETIME = f"^{_DATE_TIME}(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):?[0-5][0-9])?$"
#: A ``NaiveDatetime``: no offset.
NAIVE_DATETIME = f"^{_DATE_TIME}$"


def _put_back(value: Any, defaults: dict[str, Any]) -> Any:
    if isinstance(value, str):
        return defaults.get(value, value)
    if isinstance(value, dict):
        return {key: _put_back(item, defaults) for key, item in value.items()}
    if isinstance(value, list):
        return [_put_back(item, defaults) for item in value]
    return value


def decimal_pattern(
    max_digits: int | None, decimal_places: int | None, *, zero_before_point: bool = True
) -> str:
    """A regular expression (ECMA-262 and Python alike) for the text a writer sends of a
    ``Decimal(max_digits, decimal_places)`` (``str(value)``): at most ``decimal_places`` places
    and ``max_digits`` digits, counted as pydantic counts them (leading zeros and the
    fraction's trailing zeros do not count). The exponent form (``1E+2``, ``1E-7``, what
    ``str`` writes of such values) is checked for its form only, and the reader's lax forms
    (``.5``, ``+1``, ``1_000``, surrounding spaces) are not matched: docs/schemas.md.

    ``zero_before_point=False`` gives the pattern outboxkit 0.1.0 exported, which refused
    ``0.00`` where ``max_digits == decimal_places`` (the reader takes it): the compatibility
    walk knows both (:func:`decimal_patterns`)."""

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
            if zero_before_point:  # and zero itself with places: 0.0, 0.00
                plain = rf"0\.(?:[0-9]{{0,{decimal_places - 1}}}[1-9]0*|0+)"
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


def decimal_patterns(max_digits: int | None, decimal_places: int | None) -> set[str]:
    """The patterns outboxkit exported for a ``Decimal(max_digits, decimal_places)``, this
    release's and earlier ones' (a snapshot keeps what was exported then)."""
    return {
        decimal_pattern(max_digits, decimal_places, zero_before_point=fixed)
        for fixed in (True, False)
    }


def payload_schema(event_cls: type[Event]) -> SchemaDocument:
    """The JSON Schema of ``event_cls``' payload as its file holds it (see the module)."""
    return exported_form(annotated_schema(event_cls))


def annotated_schema(event_cls: type[Event]) -> SchemaDocument:
    """The JSON Schema of ``event_cls``' payload with outboxkit's facts as keywords, the form
    the compatibility walk reads (see the module)."""
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
    for _, node in subschemas(schema):
        if node.get("additionalProperties") is False:
            del node["additionalProperties"]


def subschemas(schema: Any, pointer: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema object in ``schema`` (itself first), walked by JSON Schema's grammar, with
    its JSON Pointer (RFC 6901) from ``schema``: a field named like a keyword is data, never
    walked as one."""
    if not isinstance(schema, dict):
        return
    yield pointer, schema
    for key in _ONE_SCHEMA:
        yield from subschemas(schema.get(key), f"{pointer}/{key}")
    for key in _SCHEMA_LISTS:
        items = schema.get(key)
        for index, sub in enumerate(items if isinstance(items, list) else ()):
            yield from subschemas(sub, f"{pointer}/{key}/{index}")
    for key in _SCHEMA_MAPS:
        members = schema.get(key)
        for name, sub in (members if isinstance(members, dict) else {}).items():
            yield from subschemas(sub, f"{pointer}/{key}/{_escape(name)}")


def _datetime_pattern(node: dict[str, Any]) -> bool:
    return node.get("pattern") in (ANY_DATETIME, NAIVE_DATETIME) and "format" not in node


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def _resolve(document: Any, pointer: str) -> Any:
    node = document
    for part in pointer.split("/")[1:]:
        name = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, list) and name.isdigit() and int(name) < len(node):
            node = node[int(name)]
        elif isinstance(node, dict) and name in node:
            node = node[name]
        else:
            return None
    return node


def exported_form(document: SchemaDocument) -> SchemaDocument:
    """``document`` (outboxkit's facts as keywords) as its file holds it: the facts in the
    ``const`` of ``$defs/x-outboxkit``, so that every validator, Ajv's strict mode too, takes
    the file as it is (see the module)."""
    exported = copy.deepcopy(document)
    definitions = exported.setdefault("$defs", {})
    metadata = definitions.get(METADATA_DEF)
    known = metadata.get("const") if isinstance(metadata, dict) else None
    facts: dict[str, Any] = dict(known) if isinstance(known, dict) else {}
    for key, name in _DOCUMENT_FACTS.items():
        if key in exported:
            facts[name] = exported.pop(key)
    decimals: dict[str, dict[str, Any]] = {}
    for pointer, node in subschemas(exported):
        found = {name: node.pop(key) for key, name in _DECIMAL_FACTS.items() if key in node}
        if found:
            decimals[pointer] = found
    if decimals:
        facts["decimals"] = {**facts.get("decimals", {}), **decimals}
    definitions[METADATA_DEF] = {"description": _METADATA_DESCRIPTION, "const": facts}
    return exported


def annotated_form(document: SchemaDocument) -> SchemaDocument:
    """``document`` as read from a file, with outboxkit's facts as keywords again (the form
    :func:`annotated_schema` gives and the compatibility walk reads). A document exported
    before the facts moved into ``$defs`` (or one already annotated) comes back unchanged."""
    definitions = document.get("$defs")
    metadata = definitions.get(METADATA_DEF) if isinstance(definitions, dict) else None
    facts = metadata.get("const") if isinstance(metadata, dict) else None
    datetimes = [node for _, node in subschemas(document) if _datetime_pattern(node)]
    if not isinstance(facts, dict) and not datetimes:
        return document
    annotated = copy.deepcopy(document)
    for _, node in subschemas(annotated):
        if _datetime_pattern(node):  # the walk compares them as exports before them wrote
            del node["pattern"]
            node["format"] = "date-time"
    if not isinstance(facts, dict):
        return annotated
    del annotated["$defs"][METADATA_DEF]
    if not annotated["$defs"]:
        del annotated["$defs"]
    for key, name in _DOCUMENT_FACTS.items():
        if name in facts:
            annotated[key] = facts[name]
    decimals = facts.get("decimals")
    for pointer, found in (decimals if isinstance(decimals, dict) else {}).items():
        node = _resolve(annotated, pointer)
        if isinstance(node, dict) and isinstance(found, dict):
            node.update({key: found[name] for key, name in _DECIMAL_FACTS.items() if name in found})
    return annotated


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

    #: As the files hold them (or as they were given: an annotated document, a file exported
    #: before the facts moved into ``$defs``).
    documents: Mapping[SlotKey, SchemaDocument]
    readable: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    @functools.cached_property
    def annotated(self) -> Mapping[SlotKey, SchemaDocument]:
        """The documents with outboxkit's facts as keywords, the form the compatibility walk
        reads (:func:`annotated_form`), whichever form they were given in."""
        return {slot: annotated_form(document) for slot, document in self.documents.items()}

    @classmethod
    def of_registry(cls, registry: EventRegistry) -> Snapshot:
        documents = {
            (model.event_type, model.event_version): payload_schema(model) for model in registry
        }
        types = {event_type for event_type, _ in documents}
        return cls(documents, {name: registry.readable_versions(name) for name in types})

    @classmethod
    def from_documents(cls, documents: Iterable[SchemaDocument]) -> Snapshot:
        """The snapshot of these documents (each as :func:`payload_schema` or
        :func:`annotated_schema` gives it)."""
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
            if isinstance(document, dict):
                document = annotated_form(document)
            slot = _slot_of(document)
            if slot is None:
                raise ConfigurationError(
                    f"{name}: not an event schema that `outboxkit schemas export` wrote "
                    f"(no ce-type and ce-schemaversion in $defs/{METADATA_DEF}); move it out of "
                    "the directory"
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
            schema_filename(*slot): render(exported_form(document))
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
        document = json.loads(text)
    except ValueError:
        return None
    return _slot_of(annotated_form(document) if isinstance(document, dict) else document)
