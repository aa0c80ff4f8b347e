"""Validation whose cost does not grow with the number of errors in the input.

pydantic reports one error per bad element of a list and per unknown key of a model, and
collects all of them before raising: a 1 MB value ``{"tags": [1, 1, …]}`` for a ``list[str]``
field makes half a million errors (seconds of CPU, hundreds of MB), and pydantic has no global
limit (pydantic/pydantic#8242, "Max errors limit", open). :func:`bounded_validator` builds,
once per event class, a validator from the class's own core schema with two changes that alter
only *how many* errors are reported, never whether the input is valid:

- every collection (list, tuple, set, dict…) stops at its first bad item (``fail_fast``, which
  pydantic supports per field since 2.8 through ``FailFast()``);
- a model that forbids unknown keys collects them (``extra_behavior="allow"``) and reports the
  first three and how many more there were as one error, instead of one error per key.

A *tolerant* validator (``tolerant=True``, the default reader of docs/schemas.md) drops those
unknown keys instead of rejecting them, at every level, and names them to the caller that asked
(:func:`collecting_unknown_fields`): a field a newer producer added is ignored, not an error.

The result is an instance of the class itself (the same validator code, the same model
validators), so a valid record decodes exactly as ``model_validate_json`` would.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import structlog
from pydantic import BaseModel, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError, SchemaValidator

from outboxkit.schemas.core_grammar import map_subschemas
from outboxkit.schemas.exceptions import SchemaError

logger = structlog.get_logger("outboxkit.schemas")

#: Core schema types that accept ``fail_fast``.
_COLLECTIONS = frozenset(
    {"list", "tuple", "set", "frozenset", "dict", "deque", "frozendict", "ordered-dict", "counter"}
)
#: Unknown keys named in an error; the rest are counted.
SHOWN_EXTRA_KEYS = 3
#: The error type that counts the unknown keys not named.
MORE_UNKNOWN_KEYS = "extra_forbidden_more"

_build_lock = threading.Lock()

#: Where a tolerant validation names the unknown keys it dropped (see
#: :func:`collecting_unknown_fields`); ``None``: nobody asked.
_unknown_fields: ContextVar[list[str] | None] = ContextVar("unknown_fields", default=None)


@contextmanager
def collecting_unknown_fields() -> Iterator[list[str]]:
    """A list that the tolerant validations run inside the block fill with the unknown keys
    they ignored (nested models' keys by their own name)."""
    names: list[str] = []
    token = _unknown_fields.set(names)
    try:
        yield names
    finally:
        _unknown_fields.reset(token)


def bounded_validator(model: type[BaseModel], *, tolerant: bool = False) -> SchemaValidator:
    """A validator for ``model`` that reports a bounded number of errors (see the module) and,
    when ``tolerant``, ignores the unknown keys of models that forbid them.

    Falls back to the model's own validator (unbounded error lists, strict, still correct) if
    its core schema has a shape this rewrite does not know, and logs that once."""
    classes: set[type[Any]] = set()
    try:
        schema = _rewrite(dict(model.__pydantic_core_schema__), None, classes, tolerant)
        _check_fields_kept(schema)
        with _built_from_schema(classes):
            return SchemaValidator(schema)
    except Exception as exc:  # a schema shape pydantic allows but this rewrite does not know
        logger.warning(
            "cannot bound the validation errors of this model; using its own validator "
            "(which rejects unknown fields, and lists every error)",
            model=f"{model.__module__}.{model.__qualname__}",
            error=repr(exc),
        )
        return model.__pydantic_validator__  # type: ignore[return-value]


def _rewrite(
    node: dict[str, Any], config: dict[str, Any] | None, classes: set[type[Any]], tolerant: bool
) -> dict[str, Any]:
    """A copy of the core schema ``node`` with collections failing fast and unknown keys
    counted (or ignored, when ``tolerant``). ``config`` is the enclosing model's (where
    pydantic reads ``extra`` from). Walks only the keys that hold schemas
    (:mod:`outboxkit.schemas.core_grammar`): field names, dict keys, tags and defaults are
    the user's data and are copied as they are."""
    kind = node["type"]
    if kind in {"model", "dataclass"}:
        classes.add(node["cls"])
        config = node.get("config", config)
    copy = map_subschemas(node, lambda sub: _rewrite(sub, config, classes, tolerant))
    if kind in _COLLECTIONS:
        copy["fail_fast"] = True
    elif kind == "model-fields":
        # (A typed dict or a dataclass that forbids unknown keys keeps pydantic's one error per
        # key: rare in event payloads, and bounded by the decoder's size limit.)
        extra = copy.get("extra_behavior") or (config or {}).get("extra_fields_behavior")
        if extra == "forbid":
            return {
                "type": "function-after",
                "function": {
                    "type": "no-info",
                    "function": _ignore_unknown_keys if tolerant else _reject_unknown_keys,
                },
                "schema": {**copy, "extra_behavior": "allow"},
            }
    return copy


def _check_fields_kept(schema: dict[str, Any]) -> None:
    """Fail closed: every model of the rewritten ``schema`` validates exactly the fields its
    class declares (pydantic's own record of them, not the core schema the rewrite read), so
    that no rewrite can ever build an event without one of its fields."""

    def visit(node: dict[str, Any]) -> dict[str, Any]:
        if node["type"] == "model" and not node.get("root_model"):
            fields = node["schema"]
            if fields["type"] == "function-after" and fields["function"]["function"] in (
                _ignore_unknown_keys,
                _reject_unknown_keys,
            ):
                fields = fields["schema"]
            declared = node["cls"].__pydantic_fields__
            if fields["type"] != "model-fields" or set(fields["fields"]) != set(declared):
                raise SchemaError(
                    f"the bounded validator of {node['cls'].__qualname__} would not validate "
                    f"its fields {sorted(declared)}"
                )
        map_subschemas(node, visit)
        return node

    visit(schema)


def _ignore_unknown_keys(value: tuple[dict[str, Any], dict[str, Any] | None, set[str]]) -> Any:
    """After a model's fields were validated with unknown keys allowed: drop them, naming them
    to whoever collects them."""
    fields, extra, fields_set = value
    if extra:
        names = _unknown_fields.get()
        if names is not None:
            names.extend(extra)
    return fields, None, fields_set


def _reject_unknown_keys(value: tuple[dict[str, Any], dict[str, Any] | None, set[str]]) -> Any:
    """After a model's fields were validated with unknown keys allowed: reject them, naming the
    first three (as pydantic would, one error each) and counting the rest in one more error."""
    fields, extra, fields_set = value
    if not extra:
        return fields, None, fields_set
    names = list(extra)
    errors: list[InitErrorDetails] = [
        {"type": "extra_forbidden", "loc": (name,), "input": extra[name]}
        for name in names[:SHOWN_EXTRA_KEYS]
    ]
    if len(names) > SHOWN_EXTRA_KEYS:
        errors.append(
            {
                "type": PydanticCustomError(
                    MORE_UNKNOWN_KEYS,
                    "and {more} more extra inputs are not permitted",
                    {"more": len(names) - SHOWN_EXTRA_KEYS},
                ),
                "loc": (),
                "input": None,
            }
        )
    raise ValidationError.from_exception_data("unknown keys", errors)


@contextmanager
def _built_from_schema(classes: set[type[Any]]) -> Iterator[None]:
    """pydantic-core reuses the validator a complete model class already has for a nested model
    (its own, unbounded one) instead of building one from the schema given; it checks the
    class's ``__pydantic_complete__``. Unset it while the bounded validator is built."""
    with _build_lock:
        flipped = [cls for cls in classes if cls.__dict__.get("__pydantic_complete__") is True]
        try:
            for cls in flipped:
                cls.__pydantic_complete__ = False
            yield
        finally:
            for cls in flipped:
                cls.__pydantic_complete__ = True
