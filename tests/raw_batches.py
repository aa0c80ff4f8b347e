"""Record batches as any Kafka client may write them: header names are bytes on the wire, which
aiokafka's producer only accepts as ``str`` (and its consumer decodes as UTF-8)."""

from __future__ import annotations

import random
import struct
from collections.abc import Sequence

from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.util import calc_crc32c

RawHeaders = Sequence[tuple[bytes, bytes | None]]
RawRecord = tuple[bytes | None, bytes | None, RawHeaders]

#: Where a v2 record batch keeps its CRC: after base offset (8), length (4), leader epoch (4)
#: and magic (1). The CRC-32C covers everything after it.
_CRC_AT = 17


def raw_batch(records: Sequence[RawRecord], *, base_offset: int = 0) -> bytes:
    """One v2 record batch of ``records`` (key, value, headers with raw-bytes names), valid on
    the wire. Built by aiokafka's builder with placeholder names of the same length, which are
    then swapped for the raw bytes, and the CRC recomputed. Names must be 4 bytes or longer.
    The placeholders depend only on ``records`` (hypothesis replays an input and must get the
    same outcome), so the rare input whose placeholder also occurs elsewhere in the batch
    always fails the same way (an AssertionError the caller skips)."""
    placeholders = random.Random(repr(records))
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=64 * 1024 * 1024,
    )
    swaps: list[tuple[bytes, bytes]] = []
    for offset, (key, value, headers) in enumerate(records):
        named: list[tuple[str, bytes | None]] = []
        for name, header_value in headers:
            placeholder = placeholders.randbytes(len(name)).hex()[: len(name)]
            assert len(placeholder) == len(name) >= 4, "use raw header names of 4+ bytes"
            swaps.append((placeholder.encode(), name))
            named.append((placeholder, header_value))
        builder.append(offset, timestamp=None, key=key, value=value, headers=named)
    batch = bytearray(builder.build())
    struct.pack_into(">q", batch, 0, base_offset)
    for placeholder, name in swaps:
        at = batch.find(placeholder)
        assert at > 0, "placeholder not found"
        assert batch.find(placeholder, at + 1) < 0, "placeholder not unique"
        batch[at : at + len(name)] = name
    struct.pack_into(">I", batch, _CRC_AT, calc_crc32c(bytes(batch[_CRC_AT + 4 :])))
    return bytes(batch)
