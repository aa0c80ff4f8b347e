"""The inbox's Kafka consumer: aiokafka's, plus a way past records aiokafka cannot read.

aiokafka parses each record of a fetched batch while :meth:`getmany` iterates it, and decodes
header *names* as UTF-8 there. Kafka keeps header names as bytes, so any client may write one
that is not UTF-8; aiokafka then raises ``UnicodeDecodeError`` out of ``getmany`` (its own
``CorruptRecordException`` for a bad CRC likewise). Worse than the error: the records of other
partitions drained in that call are lost (their positions already moved), the records before
the bad one in its partition are dropped on the next call, and every later fetch fails on the
same record — a consumer that exits on it crash-loops, one that retries spins. The Java client
leaves the position at the bad record so the application can ``seek`` past it (KAFKA-5078);
aiokafka cannot even step over it, because it parses a batch from its first record, so every
record after the bad one in the same batch is out of reach too (upstream: aio-libs/aiokafka#321,
"Skip and proceed in the case of CorruptRecordException", open).

:class:`InboxConsumer` is the one place that works around it, with aiokafka's public API except
where noted: :meth:`InboxConsumer.poll` is ``getmany`` that, when a fetched batch cannot be read,

1. seeks every partition back to the record after the last one it returned (undoing what the
   failed call drained and dropped);
2. reads the partitions one at a time, and the failing one a record at a time, up to the record
   aiokafka cannot read;
3. fetches that record's batch itself (a plain Fetch request on the consumer's client, which is
   private to aiokafka: :func:`outboxkit.core.kafka_internals.consumer_client`) and reads it
   leniently: the unreadable record becomes an
   :class:`UnreadableRecord` with what could be recovered of it (key, value, headers with raw
   names), the readable records after it in the batch are returned as usual;
4. seeks past that batch, so it is never fetched again.

If the batch cannot be fetched or parsed either, the record is returned as an
:class:`UnreadableRecord` holding only its position, and the consumer steps one offset.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypeAlias

import structlog
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from aiokafka import codec as codecs
from aiokafka.errors import CorruptRecordException, KafkaError
from aiokafka.protocol.fetch import FetchRequest
from aiokafka.record.util import calc_crc32c
from aiokafka.structs import ConsumerRecord, TopicPartition

from outboxkit.core import kafka_internals

logger = structlog.get_logger("outboxkit.inbox")

#: How long to wait for a partition's data while reading around an unreadable record.
_WAIT_MS = 2000


@dataclass(frozen=True, slots=True)
class UnreadableRecord:
    """A record the Kafka client could not read, at ``offset`` (up to ``next_offset``: a range
    when not even its batch could be parsed). ``recovered`` says whether key, value and headers
    are the record's own bytes (header names undecoded)."""

    topic: str
    partition: int
    offset: int
    next_offset: int
    error: str
    recovered: bool = False
    key: bytes | None = None
    value: bytes | None = None
    headers: tuple[tuple[bytes, bytes | None], ...] = ()


#: What :meth:`InboxConsumer.poll` returns per partition.
Fetched: TypeAlias = "ConsumerRecord[bytes, bytes] | UnreadableRecord"


def next_offset(record: Fetched) -> int:
    """The offset after ``record``."""
    if isinstance(record, UnreadableRecord):
        return record.next_offset
    offset: int = record.offset
    return offset + 1


class InboxConsumer(AIOKafkaConsumer):  # type: ignore[misc]
    """An ``AIOKafkaConsumer`` whose :meth:`poll` never fails on, nor stops at, a record it
    cannot read (see the module)."""

    def __init__(self, *topics: str, **config: Any) -> None:
        super().__init__(*topics, **config)
        self._reset_to = config.get("auto_offset_reset", "latest")
        #: Bytes of one partition's fetch (aiokafka's default, 1 MiB, unless configured).
        self._fetch_bytes = max(config.get("max_partition_fetch_bytes", 0), 1024 * 1024)
        self._read_committed = config.get("isolation_level") == "read_committed"
        #: Per partition, the offset after the last record :meth:`poll` returned.
        self._returned: dict[TopicPartition, int] = {}

    def subscribe(
        self, topics: Iterable[str], *, listener: ConsumerRebalanceListener | None = None
    ) -> None:
        super().subscribe(list(topics), listener=_Forgetting(self._returned, listener))

    def unsubscribe(self) -> None:
        """Leave the group (a LeaveGroup; no rebalance callback runs) and forget where every
        partition was."""
        self._returned.clear()
        super().unsubscribe()

    async def poll(
        self, *, timeout_ms: int, max_records: int
    ) -> dict[TopicPartition, list[Fetched]]:
        """``getmany``, with records aiokafka cannot read returned as :class:`UnreadableRecord`
        in their place."""
        try:
            batches: dict[TopicPartition, list[Fetched]] = await self.getmany(
                timeout_ms=timeout_ms, max_records=max_records
            )
        except Exception as exc:
            if not _unreadable(exc):
                raise
            batches = await self._read_around(exc, max_records)
        for tp, records in batches.items():
            if records:
                self._returned[tp] = next_offset(records[-1])
        return batches

    async def past_invisible(self, tp: TopicPartition, handled: int) -> int | None:
        """The position, if it moved past ``handled`` — the offset after the last record
        :meth:`poll` returned, all of them handled — over offsets no record was returned for:
        a ``read_committed`` consumer never returns transaction markers (every relay
        transaction ends with one) nor aborted records, yet they take offsets. Committing the
        position then, not ``handled``, leaves no lag of one behind each transaction that a
        lag alert, or the worker's own stall check, would take for a stuck partition."""
        if self._returned.get(tp) != handled or tp not in self.assignment():
            return None
        if tp in self.paused():
            return None
        position: int = await self.position(tp)
        return position if position > handled else None

    async def _read_around(
        self, error: Exception, max_records: int
    ) -> dict[TopicPartition, list[Fetched]]:
        logger.warning("a fetched batch cannot be read; reading around it", error=repr(error))
        await self._restore_positions()
        batches: dict[TopicPartition, list[Fetched]] = {}
        for tp in sorted(self.assignment()):
            if tp in self.paused() or not await self._has_records(tp):
                continue
            start = await self.position(tp)
            try:
                got = await self.getmany(tp, timeout_ms=_WAIT_MS, max_records=max_records)
                if got.get(tp):
                    batches[tp] = got[tp]
                continue
            except Exception as exc:
                if not _unreadable(exc):
                    raise
            self.seek(tp, start)  # the failed call dropped what it had read; read it again
            batches[tp] = await self._up_to_unreadable(tp, max_records)
        return batches

    async def _restore_positions(self) -> None:
        """Seek each partition to the record after the last one returned (or to where the
        group left it): the failed ``getmany`` moved some past records it never returned."""
        for tp in self.assignment():
            if tp in self._returned:
                self.seek(tp, self._returned[tp])
                continue
            committed = await self.committed(tp)
            if committed is not None:
                self.seek(tp, committed)
            elif self._reset_to == "earliest":
                await self.seek_to_beginning(tp)
            else:
                await self.seek_to_end(tp)

    async def _has_records(self, tp: TopicPartition) -> bool:
        end = self.last_stable_offset(tp) if self._read_committed else self.highwater(tp)
        return end is None or await self.position(tp) < end

    async def _up_to_unreadable(self, tp: TopicPartition, max_records: int) -> list[Fetched]:
        """The readable records of ``tp`` one at a time, then the unreadable one and the rest of
        its batch (see :meth:`_past_unreadable`)."""
        records: list[Fetched] = []
        while len(records) < max_records:
            try:
                got = await self.getmany(tp, timeout_ms=_WAIT_MS, max_records=1)
            except Exception as exc:
                if not _unreadable(exc):
                    raise
                return records + await self._past_unreadable(tp, exc)
            if not got.get(tp):
                break  # it read this time (a rebalance in between, say)
            records += got[tp]
        return records

    async def _past_unreadable(self, tp: TopicPartition, error: Exception) -> list[Fetched]:
        at = await self.position(tp)
        try:
            raw = await self._fetch_raw(tp, at)
        except KafkaError as exc:  # the broker, not the record: read it again next time
            logger.warning(
                "cannot fetch the unreadable record's batch; trying again",
                topic=tp.topic,
                partition=tp.partition,
                offset=at,
                error=repr(exc),
            )
            self.seek(tp, at)
            return []
        try:
            records, after = _read_batch(raw, tp, at, repr(error))
        except Exception as exc:  # the batch cannot be parsed at all: step over one offset
            logger.error(
                "cannot parse the unreadable record's batch; skipping one offset",
                topic=tp.topic,
                partition=tp.partition,
                offset=at,
                error=repr(exc),
            )
            self.seek(tp, at + 1)
            return [UnreadableRecord(tp.topic, tp.partition, at, at + 1, repr(error))]
        self.seek(tp, after)
        return records

    async def _fetch_raw(self, tp: TopicPartition, offset: int) -> bytes:
        """The bytes Kafka returns for ``tp`` from ``offset``: whole record batches, the first
        holding ``offset``."""
        client = kafka_internals.consumer_client(self)
        node = client.cluster.leader_for_partition(tp)
        size = self._fetch_bytes
        request = FetchRequest(
            500, 1, size, int(self._read_committed), [(tp.topic, [(tp.partition, offset, size)])]
        )
        response = await client.send(node, request)
        for _, partitions in response.topics:
            for _, error_code, _, *data in partitions:
                if error_code:
                    raise KafkaError(f"fetch error code {error_code}")
                return bytes(data[-1])
        raise KafkaError("no data for the partition in the fetch response")


def _unreadable(exc: BaseException) -> bool:
    """Whether ``getmany`` failed reading a fetched batch: what parsing records raises (a bad
    CRC, a header name that is not UTF-8, a length that does not add up), not a broker or client
    error."""
    return isinstance(exc, CorruptRecordException | ValueError | IndexError | struct.error)


class _Forgetting(ConsumerRebalanceListener):  # type: ignore[misc]
    """Forgets where a revoked partition was (its next owner moves it on), then calls the
    worker's listener."""

    def __init__(
        self, returned: dict[TopicPartition, int], listener: ConsumerRebalanceListener | None
    ) -> None:
        self._returned = returned
        self._listener = listener

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        for tp in revoked:
            self._returned.pop(tp, None)
        if self._listener is not None:
            await self._listener.on_partitions_revoked(revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        for tp in assigned:
            self._returned.pop(tp, None)
        if self._listener is not None:
            await self._listener.on_partitions_assigned(assigned)


# -- reading a record batch (format v2) leniently ----------------------------------------------

_HEADER = struct.Struct(">qiiBIhiqqqhii")  # the 61 bytes before a batch's records
_COMPRESSED = 0x07
_LOG_APPEND_TIME = 0x08
_CONTROL = 0x20


def _read_batch(raw: bytes, tp: TopicPartition, at: int, error: str) -> tuple[list[Fetched], int]:
    """The records of the first batch in ``raw`` from offset ``at``, and the offset after the
    batch. A record whose header names are not UTF-8, or every record of a batch whose CRC is
    wrong, is an :class:`UnreadableRecord` with its bytes."""
    (base, length, _, magic, crc, attributes, last_delta, first_time, max_time, *_) = (
        _HEADER.unpack_from(raw, 0)
    )
    if magic != 2:
        raise ValueError(f"record batch format v{magic} is not read here")
    end = 12 + length
    after = base + last_delta + 1
    if end > len(raw) or not base <= at < after:
        raise ValueError("the fetched batch does not hold the offset")
    if attributes & _CONTROL:
        return [], after
    crc_ok = calc_crc32c(raw[21:end]) == crc
    data = _uncompressed(attributes & _COMPRESSED, raw[_HEADER.size : end])
    records: list[Fetched] = []
    pos = 0
    offset = base
    while pos < len(data) and offset < after:
        try:
            offset, timestamp_delta, key, value, headers, pos = _read_record(data, pos, base)
        except (IndexError, ValueError) as exc:
            records.append(
                UnreadableRecord(tp.topic, tp.partition, max(offset, at), after, f"{error}; {exc}")
            )
            return records, after
        if offset < at:
            continue
        problem = None if crc_ok else "the batch's CRC does not match"
        names: list[tuple[str, bytes | None]] = []
        for name, header_value in headers:
            try:
                names.append((name.decode(), header_value))
            except UnicodeDecodeError as exc:
                problem = f"header name {name!r} is not UTF-8 ({exc.reason})"
        if problem is not None:
            records.append(
                UnreadableRecord(
                    tp.topic,
                    tp.partition,
                    offset,
                    offset + 1,
                    f"{error}: {problem}",
                    recovered=True,
                    key=key,
                    value=value,
                    headers=tuple(headers),
                )
            )
            continue
        appended = attributes & _LOG_APPEND_TIME
        records.append(
            ConsumerRecord(
                topic=tp.topic,
                partition=tp.partition,
                offset=offset,
                timestamp=max_time if appended else first_time + timestamp_delta,
                timestamp_type=1 if appended else 0,
                key=key,
                value=value,
                checksum=None,
                serialized_key_size=-1 if key is None else len(key),
                serialized_value_size=-1 if value is None else len(value),
                headers=tuple(names),
            )
        )
    return records, after


def _read_record(
    data: bytes, pos: int, base: int
) -> tuple[int, int, bytes | None, bytes | None, list[tuple[bytes, bytes | None]], int]:
    length, pos = _varint(data, pos)
    end = pos + length
    if length < 0 or end > len(data):
        raise ValueError("record length out of the batch")
    pos += 1  # attributes (unused)
    timestamp_delta, pos = _varint(data, pos)
    offset_delta, pos = _varint(data, pos)
    key, pos = _bytes(data, pos)
    value, pos = _bytes(data, pos)
    count, pos = _varint(data, pos)
    headers: list[tuple[bytes, bytes | None]] = []
    for _ in range(count):
        name, pos = _bytes(data, pos)
        header_value, pos = _bytes(data, pos)
        headers.append((name or b"", header_value))
    if pos != end:
        raise ValueError("record length does not match its content")
    return base + offset_delta, timestamp_delta, key, value, headers, end


def _bytes(data: bytes, pos: int) -> tuple[bytes | None, int]:
    length, pos = _varint(data, pos)
    if length < 0:
        return None, pos
    if pos + length > len(data):
        raise ValueError("field length out of the record")
    return data[pos : pos + length], pos + length


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """A zigzag-encoded variable-length integer (Kafka's varint/varlong)."""
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _uncompressed(codec: int, data: bytes) -> bytes:
    if codec == 0:
        return data
    decode = {
        1: codecs.gzip_decode,
        2: codecs.snappy_decode,
        3: codecs.lz4_decode,
        4: codecs.zstd_decode,
    }.get(codec)
    if decode is None:
        raise ValueError(f"unknown compression codec {codec}")
    try:
        return bytes(decode(data))
    except Exception as exc:  # damaged data, or the codec's library is not installed
        raise ValueError(f"cannot decompress the batch (codec {codec}): {exc!r}") from exc
