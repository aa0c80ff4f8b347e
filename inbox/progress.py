"""Where each partition of an inbox worker stands, and whether it is stuck.

A partition is **stalled** when records are pending (its end offset is past the next record to
handle) and it has made no progress for ``stall_after`` seconds; **parked** when the worker
stopped consuming it because a record could not be dead-lettered for a reason retrying cannot
fix. The worker's health reports both, naming the partition, the offset and the last error.

The worker also writes each partition's state into the metadata of its committed offset (a
small JSON document, refreshed every few seconds even when the offset does not move), so that
``outboxkit inbox status`` can tell the same from Kafka alone — also when the worker is hung or
dead, because then the state stops being refreshed and its last progress grows old.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aiokafka.structs import TopicPartition

#: Longest error text kept in a committed offset's metadata (Kafka's default limit for the whole
#: metadata is 4096 bytes).
METADATA_ERROR_LIMIT = 500


@dataclass
class PartitionProgress:
    """One assigned partition, as the worker sees it."""

    #: The next offset to handle (records before it took effect, were absorbed or were
    #: dead-lettered); ``None`` until the first record of the partition arrives.
    offset: int | None = None
    #: When the offset last moved, or the partition was last seen with nothing pending
    #: (``time.time()``, so that other processes can compare it).
    progress_at: float = field(default_factory=time.time)
    last_error: str | None = None
    #: Why the worker stopped consuming the partition, if it did.
    parked: str | None = None

    def advance(self, offset: int) -> None:
        if self.offset is None or offset > self.offset:
            self.offset = offset
            self.progress_at = time.time()

    def error(self, message: str) -> None:
        self.last_error = message

    def metadata(self) -> str:
        """What the committed offset carries (see the module)."""
        state: dict[str, Any] = {"progress_at": round(self.progress_at, 3)}
        if self.last_error is not None:
            state["error"] = self.last_error[:METADATA_ERROR_LIMIT]
        if self.parked is not None:
            state["parked"] = self.parked[:METADATA_ERROR_LIMIT]
        return json.dumps(state, separators=(",", ":"))


@dataclass(frozen=True)
class PartitionState:
    """A partition that needs an operator's eye: stalled or parked."""

    partition: str
    offset: int | None
    pending: int | None
    seconds_since_progress: float
    last_error: str | None
    parked: str | None = None


def read_metadata(metadata: str | None) -> dict[str, Any]:
    """The state a worker wrote into a committed offset's metadata (empty if none or foreign)."""
    if not metadata:
        return {}
    try:
        state = json.loads(metadata)
    except ValueError:
        return {}
    return state if isinstance(state, dict) else {}


def is_stalled(
    pending: int | None, progress_at: float | None, stall_after: float, now: float
) -> bool:
    """Records are pending and nothing moved for ``stall_after`` seconds."""
    return bool(pending) and (progress_at is None or now - progress_at > stall_after)


def troubled(
    partitions: Mapping[TopicPartition, PartitionProgress],
    pending: Mapping[TopicPartition, int],
    stall_after: float,
    now: float,
) -> list[PartitionState]:
    """The stalled and parked ones of ``partitions`` (``pending``: records pending of each)."""
    found = []
    for tp, progress in sorted(partitions.items()):
        if progress.parked is None and not is_stalled(
            pending.get(tp), progress.progress_at, stall_after, now
        ):
            continue
        found.append(
            PartitionState(
                partition=f"{tp.topic}/{tp.partition}",
                offset=progress.offset,
                pending=pending.get(tp),
                seconds_since_progress=round(now - progress.progress_at, 1),
                last_error=progress.last_error,
                parked=progress.parked,
            )
        )
    return found
