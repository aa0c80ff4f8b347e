"""Pathological records: the shapes that used to make decoding cost seconds and gigabytes
(docs/guarantees.md, G8), kept as regression cases, and a way to measure what one costs.

Each shape is a function of a target size that returns a record value for :class:`Hostile`
(headers from a valid encoding, so that only the value is hostile); the shapes named
``*_ignored`` go to :class:`Tolerant`, which ignores unknown fields instead of rejecting them.
outboxkit's unit tests assert a generous ceiling per shape (tests/unit/test_decode_bounded.py)
and fuzz the inbox with them; ``bench/inbox.py --shapes`` prints the measured cost. They live in
``outboxkit.testing``, which the tests and the benchmarks both import, so that bench/inbox.py
needs nothing of tests/ (the one thing bench/ takes from tests/ is the failover harness, for
bench/failover.py: tests/README.md says why); the shapes target this module's own events, models
with the field types that used to be costly.

    python -m outboxkit.testing.hostile SHAPE SIZE   # one measurement, in a fresh process (JSON)
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from outboxkit.schemas import Event, EventDecodeError, EventRegistry, encode


class Address(BaseModel):
    model_config = ConfigDict(extra="forbid")

    street: str
    number: int | None = None


class Hostile(Event, type="test.hostile", topic="hostile", key_field="name", strict_reader=True):
    """Rejects unknown fields when decoding: the shapes measure the cost of the errors."""

    name: str
    count: int = 0
    ratio: float = 0.0
    tags: list[str] = Field(default_factory=list)
    scores: dict[str, int] = Field(default_factory=dict)
    address: Address | None = None
    history: list[Address] = Field(default_factory=list)


class Tolerant(Hostile, type="test.tolerant", strict_reader=False):
    """The same fields, read as every event is by default: unknown fields ignored."""


REGISTRY = EventRegistry()
REGISTRY.register(Hostile)
REGISTRY.register(Tolerant)
_WIRE = encode(Hostile(name="n"), source="urn:test")
HEADERS = _WIRE.headers
KEY = _WIRE.key
TOLERANT_HEADERS = encode(Tolerant(name="n"), source="urn:test").headers


def _list_of_wrong_items(size: int) -> bytes:
    """{"tags": [1, 1, …]} for a list[str]: one error per item in plain pydantic."""
    return b'{"name":"n","tags":[' + b",".join([b"1"] * (size // 2)) + b"]}"


def _unknown_keys(size: int) -> bytes:
    """Tens of thousands of unknown keys where unknown keys are forbidden."""
    count = size // 14
    return json.dumps({"name": "n", **{f"k{i:08d}": 1 for i in range(count)}}).encode()


def _unknown_keys_nested(size: int) -> bytes:
    """The same, one level down (a nested model that forbids unknown keys)."""
    keys = {f"k{i:08d}": 1 for i in range(size // 14)}
    return json.dumps({"name": "n", "address": {"street": "s", **keys}}).encode()


def _list_of_bad_models(size: int) -> bytes:
    """A list of nested models, each with a wrong field."""
    return b'{"name":"n","history":[' + b",".join([b'{"street":1}'] * (size // 13)) + b"]}"


def _dict_of_wrong_values(size: int) -> bytes:
    """A dict[str, int] whose every value is wrong."""
    return json.dumps(
        {"name": "n", "scores": {f"k{i:08d}": "x" for i in range(size // 18)}}
    ).encode()


def _deep_nesting(size: int) -> bytes:
    """Arrays nested as deep as the size allows."""
    depth = size // 2
    return b'{"name":"n","tags":' + b"[" * depth + b"]" * depth + b"}"


def _huge_integer(size: int) -> bytes:
    """A number with as many digits as the size allows (10^5 digits at 100 KB)."""
    return b'{"name":"n","count":' + b"7" * size + b"}"


def _huge_float(size: int) -> bytes:
    return b'{"name":"n","ratio":0.' + b"7" * size + b"}"


def _long_escaped_string(size: int) -> bytes:
    """A string made of \\u escapes (each decoded, six bytes for one character)."""
    return b'{"name":"' + b"\\u00e9" * (size // 6) + b'"}'


def _valid_large(size: int) -> bytes:
    """A valid value of that size (the baseline the others are compared with)."""
    return json.dumps({"name": "n", "tags": ["abcdefgh"] * (size // 11)}).encode()


SHAPES: dict[str, Callable[[int], bytes]] = {
    "list_of_wrong_items": _list_of_wrong_items,
    "unknown_keys": _unknown_keys,
    "unknown_keys_nested": _unknown_keys_nested,
    "unknown_keys_ignored": _unknown_keys,
    "unknown_keys_nested_ignored": _unknown_keys_nested,
    "list_of_bad_models": _list_of_bad_models,
    "dict_of_wrong_values": _dict_of_wrong_values,
    "deep_nesting": _deep_nesting,
    "huge_integer": _huge_integer,
    "huge_float": _huge_float,
    "long_escaped_string": _long_escaped_string,
    "valid_large": _valid_large,
}


@dataclass(frozen=True)
class Cost:
    shape: str
    size: int
    #: CPU seconds of the decode call.
    seconds: float
    #: Peak resident memory above what the process had before the call, in MB.
    extra_mb: float
    #: The decode error's reason and message, or "ok".
    outcome: str
    message: str


def decode_cost(shape: str, size: int) -> Cost:
    """Decode one record of ``shape`` (about ``size`` bytes) in this process and measure it.
    Meaningful in a fresh process only: the peak memory of a process never goes down."""
    value = SHAPES[shape](size)
    headers = TOLERANT_HEADERS if shape.endswith("_ignored") else HEADERS
    REGISTRY.decode(topic="hostile", key=KEY, value=_valid_large(100), headers=headers)  # warm up
    before = _peak_mb()
    started = time.process_time()
    try:
        REGISTRY.decode(topic="hostile", key=KEY, value=value, headers=headers)
        outcome, message = "ok", ""
    except EventDecodeError as exc:
        outcome, message = str(exc.reason), str(exc)
    seconds = time.process_time() - started
    return Cost(shape, len(value), seconds, _peak_mb() - before, outcome, message[:300])


def measure(shape: str, size: int) -> Cost:
    """:func:`decode_cost` in a fresh Python process."""
    result = subprocess.run(
        [sys.executable, "-m", "outboxkit.testing.hostile", shape, str(size)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return Cost(**json.loads(result.stdout.splitlines()[-1]))  # after any log line


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


if __name__ == "__main__":
    cost = decode_cost(sys.argv[1], int(sys.argv[2]))
    print(json.dumps(cost.__dict__))
