"""G4 on what Kafka holds: which producer wrote each committed record.

Every record batch carries its producer's id and epoch. The relay publishes a block's
partitions with one transactional producer; a new owner of a partition initialises every
transactional id that could carry it (``outboxkit/relay/blocks.py``), which bumps that id's
epoch and fences the old producer — so each producer session, (producer id, epoch), is one
publisher, and a session never comes back once another one has published the partition.

So, per partition, the committed records in offset order must form one contiguous run per
producer session: a session that reappears after another is two publishers of the partition
at once (a zombie that was not fenced). Nothing in the records' headers names the relay; the
batches' producer ids are what the topic can show.

The batches are read with plain Fetch requests (``read_uncommitted``, everything up to the high
watermark, aborted transactions too); which records are committed is what the
``read_committed`` reader saw (:mod:`tests.failover.arrivals`)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping

from aiokafka.client import AIOKafkaClient
from aiokafka.errors import LeaderNotAvailableError, NotLeaderForPartitionError, for_code
from aiokafka.protocol.fetch import FetchRequest
from aiokafka.record.memory_records import MemoryRecords

from outboxkit.embedded.kafka_topology import KafkaTopology

#: (producer id, producer epoch)
Session = tuple[int, int]


async def producer_sessions(
    topology: KafkaTopology, bootstrap: str, topic: str, partitions: int
) -> dict[int, dict[int, Session]]:
    """Partition → offset → the producer session of the batch that holds it (data records
    only, committed or not). ``topology`` names each partition's leader."""
    client = AIOKafkaClient(bootstrap_servers=bootstrap, client_id="failover-g4")
    await client.bootstrap()
    try:
        return {p: await _read_partition(topology, client, topic, p) for p in range(partitions)}
    finally:
        await client.close()


#: Errors after which the partition's leader is another broker (or is being elected).
_LEADER_MOVED = (NotLeaderForPartitionError, LeaderNotAvailableError)


async def _read_partition(
    topology: KafkaTopology, client: AIOKafkaClient, topic: str, partition: int
) -> dict[int, Session]:
    sessions: dict[int, Session] = {}
    offset = 0
    leader = await topology.partition_leader(topic, partition)
    async with asyncio.timeout(60):
        while True:
            request = FetchRequest(500, 1, 4 << 20, 0, [(topic, [(partition, offset, 4 << 20)])])
            response = await client.send(leader, request)
            [(_, [(_, error_code, highwater, *data)])] = response.topics
            if error_code:
                error = for_code(error_code)
                if not error.retriable:
                    raise error(f"fetching {topic}/{partition} at {offset}")
                # Ask the broker that leads it now: once elected, if the leader moved.
                moved = issubclass(error, _LEADER_MOVED)
                leader = await topology.partition_leader(
                    topic, partition, other_than=leader if moved else None
                )
                continue
            records = MemoryRecords(data[-1])
            while (batch := records.next_batch()) is not None:
                if not batch.is_control_batch:
                    for record in batch:
                        sessions[record.offset] = (batch.producer_id, batch.producer_epoch)
                offset = batch.next_offset
            if offset >= highwater:
                return sessions


def check_one_publisher(
    committed: Mapping[int, Iterable[int]], sessions: Mapping[int, Mapping[int, Session]]
) -> str:
    """G4: per partition, the producer sessions of the committed offsets, in offset order, form
    contiguous runs. Returns a summary; raises AssertionError at the first session that came
    back after another had published."""
    changes = 0
    for partition, offsets in sorted(committed.items()):
        seen: set[Session] = set()
        current: Session | None = None
        for offset in sorted(offsets):
            session = sessions[partition].get(offset)
            assert session is not None, f"no batch holds {partition}@{offset}"
            if session == current:
                continue
            assert session not in seen, (
                f"G4 violated on partition {partition}: producer {session[0]} epoch "
                f"{session[1]} published again at offset {offset} after {current} had"
            )
            seen.add(session)
            current = session
            changes += 1
    return f"{changes} publisher sessions over {len(committed)} partitions, none interleaved"
