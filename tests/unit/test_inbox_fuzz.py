"""Property-based fuzzing of what the inbox does with bytes anyone can write (issue #16): the
decoder, the dead-letter builder and the lenient record-batch reader.

CI runs a modest number of examples; ``bench/fuzz_inbox.py`` runs the same properties for
longer (``OUTBOXKIT_FUZZ_EXAMPLES``). Shapes that once cost too much are regression cases in
``outboxkit/testing/hostile.py`` and as ``@example``s here.
"""

from __future__ import annotations

import json
import os
import struct
import time
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.record.default_records import DefaultRecordBatch
from aiokafka.structs import ConsumerRecord
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from outboxkit.inbox.deadletter import (
    ORIGINAL_SIZE,
    SOURCE_OFFSET,
    TRUNCATED,
    dead_letter,
    record_size,
)
from outboxkit.inbox.kafka import UnreadableRecord, _read_batch
from outboxkit.schemas import DecodeErrorReason, Event, EventDecodeError, encode
from outboxkit.schemas import wire as wire_module
from outboxkit.testing.hostile import HEADERS, KEY, REGISTRY, SHAPES, Hostile
from tests.raw_batches import raw_batch

FUZZ = settings(
    max_examples=int(os.environ.get("OUTBOXKIT_FUZZ_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
#: CPU seconds one decode may take, whatever the input (fuzzed inputs stay under 64 KB).
DECODE_SECONDS_AT_MOST = 0.25

# -- the decoder --------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)
payloads = st.fixed_dictionaries(
    {"name": st.text(min_size=1, max_size=20)},
    optional={
        "count": st.integers() | json_values,
        "ratio": st.floats(allow_nan=False) | json_values,
        "tags": st.lists(st.text(max_size=10) | json_values, max_size=10),
        "scores": st.dictionaries(st.text(max_size=8), st.integers() | json_values, max_size=10),
        "address": json_values | st.fixed_dictionaries({"street": st.text(max_size=10)}),
        "history": st.lists(json_values, max_size=5),
        "id": json_values,
        "unknown": json_values,
    },
)


@st.composite
def values(draw: st.DrawFn) -> bytes:
    """Record values: JSON payloads, formatted in many ways, then perhaps mutated."""
    payload = draw(payloads)
    text = json.dumps(
        payload,
        ensure_ascii=draw(st.booleans()),
        indent=draw(st.none() | st.integers(0, 2)),
        allow_nan=True,
    ).encode()
    mutation = draw(st.sampled_from(["none", "flip", "cut", "insert", "repeat"]))
    if mutation == "none" or not text:
        return text
    at = draw(st.integers(0, len(text) - 1))
    if mutation == "flip":
        return text[:at] + bytes([text[at] ^ draw(st.integers(1, 255))]) + text[at + 1 :]
    if mutation == "cut":
        return text[:at]
    if mutation == "insert":
        return text[:at] + draw(st.binary(min_size=1, max_size=8)) + text[at:]
    return text[:at] + text[at:] * draw(st.integers(2, 50))


headers_lists = st.lists(
    st.tuples(
        st.sampled_from([name for name, _ in HEADERS]) | st.text(max_size=12),
        st.binary(max_size=40) | st.sampled_from([value for _, value in HEADERS]),
    ),
    max_size=10,
)


def _decode(value: bytes | None, headers: Any = HEADERS, key: bytes | None = KEY) -> Any:
    started = time.process_time()
    try:
        return REGISTRY.decode(
            topic="hostile", key=key, value=value, headers=headers, max_bytes=64 * 1024
        )
    except EventDecodeError as exc:  # the only exception the decoder may raise
        return exc.reason
    finally:
        assert time.process_time() - started <= DECODE_SECONDS_AT_MOST


@FUZZ
@given(values())
@example(SHAPES["list_of_wrong_items"](60_000))
@example(SHAPES["unknown_keys"](60_000))
@example(SHAPES["unknown_keys_nested"](60_000))
@example(SHAPES["deep_nesting"](60_000))
@example(SHAPES["huge_integer"](60_000))
@example(b'{"name":"n","\\u0069d":"x"}')  # an envelope field spelled with an escape
@example(b'{"name":"n"} {"name":"m"}')
@example(b"{ }")
@example(b'{"name":"n",}')
def test_any_value_decodes_or_raises_a_decode_error_quickly(value: bytes) -> None:
    assert isinstance(_decode(value), Hostile | DecodeErrorReason)


@FUZZ
@given(values())
def test_the_fast_path_and_the_careful_path_agree(value: bytes) -> None:
    """The decoder validates a plain payload object in place (the envelope spliced in); the
    careful path parses it in Python first. Both give the same event or the same reason."""
    fast = _decode(value)
    careful = _with_careful_path_only(value)
    if isinstance(fast, Event) or isinstance(careful, Event):
        assert fast == careful
        assert type(fast) is type(careful)
    else:
        assert fast == careful


def _with_careful_path_only(value: bytes) -> Any:
    splice = wire_module._spliced_document
    wire_module._spliced_document = lambda *args: None  # type: ignore[assignment]
    try:
        return _decode(value)
    finally:
        wire_module._spliced_document = splice


@FUZZ
@given(headers_lists, st.binary(max_size=30) | st.none())
def test_any_headers_and_key_decode_or_raise_a_decode_error(
    headers: list[tuple[str, bytes]], key: bytes | None
) -> None:
    assert isinstance(
        _decode(b'{"name":"n"}', headers=headers, key=key), Hostile | DecodeErrorReason
    )


@FUZZ
@given(
    st.text(min_size=1, max_size=30),
    st.lists(st.text(max_size=10), max_size=5),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=5),
)
def test_valid_events_round_trip(name: str, tags: list[str], scores: dict[str, int]) -> None:
    event = Hostile(name=name, tags=tags, scores=scores)
    wire = encode(event, source="urn:fuzz")
    assert REGISTRY.decode_record(wire) == event  # type: ignore[arg-type]


# -- dead letters ---------------------------------------------------------------------------------

header_values = st.binary(max_size=300) | st.none()


@st.composite
def consumed(draw: st.DrawFn) -> ConsumerRecord[bytes, bytes] | UnreadableRecord:
    big = draw(st.integers(0, 300_000))
    key = draw(st.none() | st.binary(max_size=2000))
    value = draw(st.none() | st.binary(max_size=200)) if not big else b"v" * big
    if draw(st.booleans()):
        headers = draw(st.lists(st.tuples(st.text(max_size=30), header_values), max_size=30))
        return ConsumerRecord(
            "topic", 3, draw(st.integers(0, 2**62)), 0, 0, key, value, None, 0, 0, tuple(headers)
        )
    raw = draw(st.lists(st.tuples(st.binary(max_size=30), header_values), max_size=30))
    return UnreadableRecord("topic", 3, 7, 8, "why", True, key, value, tuple(raw))


@FUZZ
@given(consumed(), st.integers(2_000, 400_000), st.text(max_size=3000))
def test_a_dead_letter_always_fits_and_says_where_the_original_is(
    record: ConsumerRecord[bytes, bytes] | UnreadableRecord, max_bytes: int, error: str
) -> None:
    letter = dead_letter(record, inbox="i", reason="r", error=error, max_bytes=max_bytes)
    assert record_size(letter.key, letter.value, letter.headers) <= max_bytes
    assert letter.key is not None or letter.value is not None, "Kafka needs one of them"
    headers = dict(letter.headers)
    assert headers[SOURCE_OFFSET] == str(record.offset).encode()
    if letter.truncated:
        assert headers[TRUNCATED] == b"true"
        assert int(headers[ORIGINAL_SIZE] or b"0") > max_bytes
        assert (record.value or b"").startswith(letter.value or b"")
    else:
        assert letter.key == record.key
        assert letter.value == (
            b"" if record.key is None and record.value is None else record.value
        )


# -- record batches aiokafka cannot read -----------------------------------------------------------

names = st.binary(min_size=4, max_size=12)
raw_records = st.lists(
    st.tuples(
        st.none() | st.binary(max_size=20),
        st.none() | st.binary(max_size=50),
        st.lists(st.tuples(names, st.none() | st.binary(max_size=10)), max_size=4),
    ),
    min_size=1,
    max_size=8,
)


def _readable(name: bytes) -> bool:
    try:
        name.decode()
    except UnicodeDecodeError:
        return False
    return True


@FUZZ
@given(raw_records, st.integers(0, 10**12), st.data())
def test_the_lenient_reader_recovers_every_record_of_a_batch(
    records: list[Any], base: int, data: st.DataObject
) -> None:
    try:
        raw = raw_batch(records, base_offset=base)
    except AssertionError:  # a random name repeated elsewhere in the batch: pick again
        return
    at = base + data.draw(st.integers(0, len(records) - 1))
    read, after = _read_batch(raw, TopicPartition("t", 0), at, "e")
    assert after == base + len(records)
    assert [r.offset for r in read] == list(range(at, after))
    for got, (key, value, headers) in zip(read, records[at - base :], strict=True):
        assert (got.key, got.value) == (key, value)
        if all(_readable(name) for name, _ in headers):
            assert isinstance(got, ConsumerRecord)
            assert list(got.headers) == [(n.decode(), v) for n, v in headers]
        else:
            assert isinstance(got, UnreadableRecord)
            assert got.recovered
            assert list(got.headers) == list(headers)


@FUZZ
@given(raw_records, st.data())
def test_the_lenient_reader_fails_cleanly_on_damaged_batches(
    records: list[Any], data: st.DataObject
) -> None:
    try:
        raw = bytearray(raw_batch(records))
    except AssertionError:
        return
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    raw = raw[: data.draw(st.integers(0, len(raw)))]
    try:
        read, _ = _read_batch(bytes(raw), TopicPartition("t", 0), 0, "e")
    except (ValueError, IndexError, struct.error):
        return
    assert all(isinstance(r, ConsumerRecord | UnreadableRecord) for r in read)


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_a_batch_that_cannot_be_decompressed_is_a_damaged_batch(codec: int) -> None:
    """A batch whose attributes name a codec its bytes are not in (or whose library is not
    installed: snappy, lz4 and zstd are optional in aiokafka) raises ``ValueError``, as every
    damaged batch does; hypothesis found gzip's ``BadGzipFile`` and the codecs'
    ``NotImplementedError`` escaping the lenient reader."""
    raw = bytearray(raw_batch([(b"key1", b"value", [])]))
    raw[22] = (raw[22] & ~0x07) | codec  # the attributes' low byte: the compression codec
    with pytest.raises(ValueError, match=f"codec {codec}"):
        _read_batch(bytes(raw), TopicPartition("t", 0), 0, "e")


def test_aiokafka_still_cannot_read_a_header_name_that_is_not_utf8() -> None:
    """Why InboxConsumer exists (aio-libs/aiokafka#321). When this fails, aiokafka reads such
    records itself and the workaround in outboxkit/inbox/kafka.py can be revisited."""
    raw = raw_batch([(b"k", b"v", [(b"bad\xffname", b"x")])])
    with pytest.raises(UnicodeDecodeError):
        list(DefaultRecordBatch(raw))
