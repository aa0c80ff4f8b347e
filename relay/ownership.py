"""Partition ownership: the relay's Kafka consumer-group membership is its right to publish.

The relay's consumer subscribes to the topics it publishes to and pauses every partition it is
assigned, so it never fetches data; it only keeps polling to stay in the group. Kafka's
rebalance protocol then spreads the partitions over the relay instances (contiguous ranges,
:mod:`outboxkit.relay.assignor`) and moves them when an instance joins, leaves or dies.

Kafka's consumer rebalances eagerly: every member gives up all its partitions before it rejoins.
With transactions the relay does not stop publishing then (*lazy revocation*): it keeps its
partitions until the new assignment arrives and stops only those that moved. That is safe
because the new owner of a partition fences every producer that could carry it before it reads
the partition (:mod:`outboxkit.relay.blocks`): whatever the old owner commits before that fence
is in Kafka before the new owner reads, and nothing it sends after can commit. So a rebalance,
however long (a dead member is waited for until its session times out), pauses only the
partitions that change hands. Without transactions nothing would fence the old owner, so there
every partition is revoked and drained before the rebalance continues, as Kafka intends.

aiokafka awaits the rebalance callbacks but logs and swallows what they raise, so they never
raise: a failure to drain is logged, and correctness rests on fencing, not on the callback.

A member that cannot reach the group coordinator (a half-open link: its requests go unanswered,
its sockets stay open) is dropped by the coordinator after the session timeout, and the group
gives its partitions to others, while aiokafka's consumer still lists them as assigned (its
heartbeat request waits ``request_timeout_ms``, 40 s, before it even fails). So the relay keeps
its own clock of the coordinator's answers (:meth:`KafkaOwnership.lapsed`): once none came for
twice the session timeout (longer still while a join is pending), the membership has
lapsed — the relay stops publishing every partition, as on a revocation, and reports itself
unhealthy until a new assignment arrives. Kafka fences whatever it still had in flight.

A relay that cannot read its database keeps heartbeating, so the group keeps its partitions
with it, waiting. :meth:`KafkaOwnership.step_aside` leaves the group for as long as that lasts
(the decision is :class:`~outboxkit.core.step_aside.StepAside`'s), so that the other relays
publish them; :meth:`KafkaOwnership.step_in` joins again.

A dead member is waited for until its session times out; a relay that learns of the death
sooner (from the database, :meth:`OutboxStorage.departed_members`) removes it with
:meth:`KafkaOwnership.evict`: a LeaveGroup sent on its behalf, which Kafka accepts from any
client. Removing a live member is safe too (it rejoins, and fencing stops its old producer).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog
from aiokafka import AIOKafkaClient, ConsumerRebalanceListener
from aiokafka import TopicPartition as KafkaTP
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.client import ConnectionGroup, CoordinationType
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment
from aiokafka.errors import (
    GroupIdNotFound,
    InconsistentGroupProtocolError,
    KafkaError,
    UnknownMemberIdError,
    for_code,
)
from aiokafka.protocol.group import LeaveGroupRequest

from outboxkit.core import kafka_clients, kafka_internals
from outboxkit.core.kafka import admin_client, missing_topics
from outboxkit.relay.assignor import BlockAssignor
from outboxkit.relay.records import TopicPartition
from outboxkit.relay.settings import RelaySettings

logger = structlog.get_logger("outboxkit.relay")

PartitionsCallback = Callable[[frozenset[TopicPartition]], Awaitable[None]]

#: A membership lapses after this many session timeouts without an answer from the coordinator
#: (:meth:`KafkaOwnership.lapsed`).
LAPSE_AFTER_SESSIONS = 2

#: A refused join (another relay version holds the group) is logged at most this often.
_REFUSED_LOG_EVERY = 30.0


class KafkaOwnership:
    """Joins group ``outboxkit.relay.<name>``; calls back with the partitions this member gains
    (``on_assigned``, after every rebalance, possibly with none) and loses (``on_revoked``)."""

    def __init__(
        self,
        settings: RelaySettings,
        *,
        on_assigned: PartitionsCallback,
        on_revoked: PartitionsCallback,
    ) -> None:
        self._settings = settings
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked
        self._lazy = settings.transactional
        who = settings.instance_id or f"{socket.gethostname()}-{os.getpid()}"
        #: The client id Kafka lists for this member, unique to the process (a restarted
        #: container may have the same host name and pid): the relay's presence key.
        self.process_key = f"{settings.group_id}-{who}-{secrets.token_hex(4)}"
        #: This member's assignor: what it asks not to be given (:meth:`step_aside_from`).
        self._assignor = BlockAssignor()
        self._consumer = kafka_clients.consumer(
            settings,
            group_id=settings.group_id,
            group_instance_id=settings.instance_id,
            enable_auto_commit=False,
            auto_offset_reset="latest",
            session_timeout_ms=int(settings.session_timeout * 1000),
            heartbeat_interval_ms=int(settings.heartbeat_interval * 1000),
            # The revocation callback drains in-flight records: give it time before the group
            # gives up on this member.
            rebalance_timeout_ms=int((settings.revoke_timeout + settings.session_timeout) * 1000),
            partition_assignment_strategy=(self._assignor,),
            client_id=self.process_key,
        )
        #: What aiokafka's consumer knows of its membership (its group coordinator's state).
        self._membership = kafka_internals.GroupMembership(self._consumer)
        self.owned: frozenset[TopicPartition] = frozenset()
        self.rebalances = 0
        #: Monotonic time of the last completed assignment.
        self.assigned_at: float | None = None
        self._refused_logged = 0.0
        self._admin: AIOKafkaAdminClient | None = None
        self._client: AIOKafkaClient | None = None
        self._closing = contextlib.AsyncExitStack()
        self._confirming = asyncio.Lock()
        #: Monotonic time the group coordinator last answered this member (a heartbeat, a
        #: completed join); None before the first join.
        self._heard_at: float | None = None
        #: Monotonic time the membership lapsed (:meth:`lapsed`), until the next assignment.
        self._lapsed_at: float | None = None
        #: Out of the group on purpose (:meth:`step_aside`), until :meth:`step_in`.
        self._aside = False

    @property
    def member_id(self) -> str | None:
        """This member's id in the group (for operators), once joined."""
        return self._membership.member_id

    async def start(self) -> dict[str, int]:
        """Join the group; return each topic's partition count from Kafka's metadata."""
        self._consumer.subscribe(self._settings.topics, listener=_Listener(self))
        # start() fetches the metadata of the subscribed topics before it returns.
        try:
            await self._consumer.start()
        except InconsistentGroupProtocolError:
            # The group's members run a relay of another assignor protocol (a rolling upgrade
            # across a protocol change, docs/upgrading.md): wait in run() until they have
            # stopped, as after a refused rejoin, instead of exiting (a crash loop whose
            # back-off would outlast the old relays' stop).
            self._refused()
        self._hear_heartbeats()
        partitions: dict[str, int] = {}
        missing = []
        for topic in self._settings.topics:
            found = self._consumer.partitions_for_topic(topic)
            if not found:
                missing.append(topic)
            else:
                partitions[topic] = len(found)
        if missing:
            await self._consumer.stop()
            raise missing_topics(missing)
        return partitions

    def partition_counts(self) -> dict[str, int]:
        counts = {}
        for topic in self._settings.topics:
            found = self._consumer.partitions_for_topic(topic)
            if found:
                counts[topic] = len(found)
        return counts

    async def run(self) -> None:
        """Stay in the group: poll (nothing comes back, every partition is paused); stop
        publishing everything once the membership has lapsed (:meth:`lapsed`)."""
        while True:
            try:
                await self._consumer.getmany(timeout_ms=500)
            except InconsistentGroupProtocolError:
                self._refused()
                await asyncio.sleep(1.0)
                continue
            # Kafka forgets pauses on rebalance; re-pause whatever is assigned now.
            assigned = self._consumer.assignment()
            if assigned - self._consumer.paused():
                self._consumer.pause(*assigned)
            await self._check_membership()

    def lapsed(self) -> float | None:
        """Seconds since the group coordinator last answered this member, once the group has
        surely dropped it: no answer for twice the session timeout (the coordinator's own limit
        is one session timeout from the last heartbeat it received), or longer by the session
        and rebalance timeouts while a join is pending (which the coordinator may hold until
        every member has joined) or while the coordinator is being looked for (its broker
        refused or dropped the connection: a coordinator that moves to another broker gives every
        member a new session when it takes over, and a failover took 6+ s on a loaded test
        cluster, which stopped every relay for nothing). A half-open link leaves the
        coordinator known (the heartbeat waits for its answer): the short limit applies. None
        while the membership holds. Lapsing late is safe, early costs a pause: a relay that lost
        its partitions is fenced by their new owner's first transaction."""
        heard = self._heard_at
        if heard is None or self._aside:
            return None
        silent = time.monotonic() - heard
        limit = LAPSE_AFTER_SESSIONS * self._settings.session_timeout
        if self._rejoining() or self._coordinator_unknown():
            limit += self._settings.revoke_timeout + self._settings.session_timeout
        return silent if silent > limit else None

    async def _check_membership(self) -> None:
        """Once the membership has lapsed, stop publishing every partition (they are
        someone else's now) until the group assigns this relay partitions again — or until the
        coordinator answers a heartbeat again without a rebalance (it moved to another broker
        and kept the group as it was): the member's assignment then still holds, and it takes
        its partitions back (each block confirms the generation before it publishes)."""
        silent = self.lapsed()
        if silent is None:
            if self._lapsed_at is not None and not self._rejoining():
                self._lapsed_at = None
                kept = frozenset(
                    TopicPartition(tp.topic, tp.partition) for tp in self._consumer.assignment()
                )
                self.owned = kept
                logger.info(
                    "the group coordinator answers again; this relay's assignment holds",
                    partitions=sorted(map(str, kept)),
                )
                if kept:
                    await self._on_assigned(kept)
            return
        if not self.owned:
            return
        lost, self.owned = self.owned, frozenset()
        self._lapsed_at = time.monotonic()
        logger.warning(
            "no answer from the group coordinator: the group has given this relay's "
            "partitions to others; publishing none until it rejoins",
            silent_for=round(silent, 1),
            partitions=sorted(map(str, lost)),
        )
        await self._on_revoked(lost)

    async def step_aside(self) -> None:
        """Leave the group (a LeaveGroup: the others take this relay's partitions in the
        rebalance it starts, and the first transaction of each new owner fences whatever this
        relay still has in flight), then stop publishing every partition, until
        :meth:`step_in`. With static membership (``instance_id``) no LeaveGroup is sent: the
        partitions move once the session times out."""
        if self._aside:
            return
        self._aside = True
        # Leave first: stopping the workers waits for their batches in flight, which wait on
        # the database this relay cannot read (up to revoke_timeout), and the group should not.
        self._consumer.unsubscribe()
        lost, self.owned = self.owned, frozenset()
        self._lapsed_at = None
        if lost:
            logger.info("partitions given up", partitions=sorted(map(str, lost)))
            await self._on_revoked(lost)

    async def step_aside_from(self, partitions: frozenset[TopicPartition]) -> None:
        """Rejoin the group asking not to be given ``partitions`` (its assignor places every
        range where nobody asked to avoid it, if it can), from now until
        :meth:`avoid_nothing`. Nothing happens while this relay is aside."""
        if self._aside:
            return
        by_topic: dict[str, set[int]] = {}
        for tp in partitions:
            by_topic.setdefault(tp.topic, set()).add(tp.partition)
        self._assignor.avoid = {t: frozenset(ps) for t, ps in by_topic.items()}
        await self.step_aside()
        self.step_in()

    def avoid_nothing(self) -> None:
        """Ask for no partition to be kept from this relay any more: from its next join (the
        next rebalance, whatever starts it)."""
        self._assignor.avoid = {}

    def step_in(self) -> None:
        """Join the group again after :meth:`step_aside`; the assignment comes as after any
        rebalance."""
        if not self._aside:
            return
        self._aside = False
        if self._heard_at is not None:
            self._heard_at = time.monotonic()  # the lapse clock starts again with the join
        self._consumer.subscribe(self._settings.topics, listener=_Listener(self))

    def _hear_heartbeats(self) -> None:
        """Note every heartbeat the coordinator answers (also while the group rebalances: the
        member is still in it). Without a coordinator to hear (a consumer that did not start),
        no membership ever lapses here (Kafka still fences what the relay sends)."""
        self._heard_at = time.monotonic()
        if not self._membership.on_heartbeat_answered(self._heard):
            self._heard_at = None

    def _heard(self) -> None:
        self._heard_at = time.monotonic()

    def _refused(self) -> None:
        now = time.monotonic()
        if now - self._refused_logged >= _REFUSED_LOG_EVERY:
            self._refused_logged = now
            logger.warning(
                "Kafka refused this relay's join: the group's members run another outboxkit "
                "version (assignor). Waiting until they have stopped",
                group=self._settings.group_id,
            )

    async def confirm(self, partitions: frozenset[TopicPartition]) -> bool:
        """Whether this member is, right now, in the group's current generation and assigned
        every one of ``partitions``: they are in the consumer's current assignment, and an
        offset commit (a partition's current position, which changes nothing) is accepted,
        which the coordinator does only for a member of the current generation. A relay that
        lost its membership without noticing yet (frozen, cut off) gets False and must not
        initialise a producer: that could fence the rightful owner's block, or run beside it
        under another block's id."""
        assigned = self._consumer.assignment()
        mine = {KafkaTP(tp.topic, tp.partition) for tp in partitions}
        if not mine or not mine <= assigned:
            return False
        tp = min(mine)
        # One commit at a time, and none while this member has no generation or is rejoining:
        # aiokafka resets the member id and generation on *any* commit refused as from an
        # unknown member, even one sent before a rejoin that has since given it a new id. Such
        # a late reset strands the new member in the group, which then waits for it until its
        # session times out, and again at each rejoin (seen when a live relay was removed).
        async with self._confirming:
            if self._rejoining():
                return False
            try:
                async with asyncio.timeout(self._settings.session_timeout):
                    position = await self._consumer.position(tp)
                    await self._consumer.commit({tp: position})
            except (KafkaError, TimeoutError) as exc:
                if isinstance(exc, TimeoutError):
                    kafka_internals.abandoned_commits_read()
                logger.info("membership not confirmed", error=repr(exc))
                return False
        return True

    def _coordinator_unknown(self) -> bool:
        return not self._membership.coordinator_known

    def _rejoining(self) -> bool:
        return self._membership.rejoining

    async def evict_process(self, process_key: str) -> int:
        """Remove from the group now every member whose client id is ``process_key`` (in any
        state, a rebalance included); how many there were."""
        admin = await self._admin_client()
        group = self._settings.group_id
        _, members = await describe_group(admin, group)
        removed = 0
        for member in members:
            if member.client_id != process_key:
                continue
            # A LeaveGroup on the member's behalf, through aiokafka's public low-level client.
            client = await self._low_level_client()
            node = await client.coordinator_lookup(CoordinationType.GROUP, group)
            response = await client.send(
                node,
                LeaveGroupRequest(group, member.member_id),
                group=ConnectionGroup.COORDINATION,
            )
            error = for_code(response.error_code)
            if response.error_code == 0:
                removed += 1
            elif error is not UnknownMemberIdError:  # already gone: nothing to do
                raise error()
        return removed

    async def _admin_client(self) -> AIOKafkaAdminClient:
        """Made at the first check that finds a dead relay; closed by :meth:`stop`."""
        if self._admin is None:
            self._admin = await self._closing.enter_async_context(
                admin_client(self._settings, client_id=f"{self._settings.group_id}-admin")
            )
        return self._admin

    async def _low_level_client(self) -> AIOKafkaClient:
        """Made at the first eviction; closed by :meth:`stop`."""
        if self._client is None:
            client = kafka_clients.client(
                self._settings, client_id=f"{self._settings.group_id}-evictions"
            )
            self._closing.push_async_callback(client.close)
            await client.bootstrap()
            self._client = client
        return self._client

    async def stop(self) -> None:
        """Leave the group (revocation drains first). A static member (``instance_id``) does
        not leave: Kafka keeps its partitions for it until the session timeout."""
        try:
            await self._consumer.stop()
        finally:
            await self._closing.aclose()

    async def _assigned(self, assigned: set[KafkaTP]) -> None:
        self._consumer.pause(*assigned)
        new = frozenset(TopicPartition(tp.topic, tp.partition) for tp in assigned)
        old, self.owned = self.owned, new
        self.rebalances += 1
        self.assigned_at = time.monotonic()
        if self._heard_at is not None:
            self._heard_at = self.assigned_at  # the coordinator answered the join
        if self._lapsed_at is not None:
            logger.info(
                "rejoined the group",
                after=round(self.assigned_at - self._lapsed_at, 1),
                partitions=sorted(map(str, new)),
            )
            self._lapsed_at = None
        gained, lost = new - old, old - new
        if lost:
            logger.info("partitions revoked", partitions=sorted(map(str, lost)))
            await self._on_revoked(lost)
        logger.info(
            "partitions assigned", partitions=sorted(map(str, new)), gained=sorted(map(str, gained))
        )
        await self._on_assigned(gained)

    async def _revoked(self, revoked: set[KafkaTP]) -> None:
        if self._lazy:
            return  # keep publishing until the new assignment says what moved
        gone = frozenset(TopicPartition(tp.topic, tp.partition) for tp in revoked)
        self.owned = self.owned - gone
        if gone:
            logger.info("partitions revoked", partitions=sorted(map(str, gone)))
            await self._on_revoked(gone)


@dataclass
class GroupMember:
    member_id: str
    client_id: str
    host: str
    assigned: list[TopicPartition]


async def describe_group(
    admin: AIOKafkaAdminClient, group_id: str
) -> tuple[str, list[GroupMember]]:
    """Kafka's state of ``group_id`` (Stable, PreparingRebalance, …, Dead) and its members."""
    members: list[GroupMember] = []
    state = "Dead"
    for response in await admin.describe_consumer_groups([group_id]):
        for group in response.groups:
            # (error_code, group_id, state, protocol_type, protocol, members[, …]); a member is
            # (member_id, [group_instance_id,] client_id, client_host, metadata, assignment).
            if group[0] == GroupIdNotFound.errno:  # newer brokers: a group nobody joined yet
                continue
            if group[0]:  # e.g. the coordinator is still loading the group after a restart
                raise for_code(group[0])()
            state = str(group[2])
            for member in group[5]:
                assigned: list[TopicPartition] = []
                if member[-1]:
                    decoded = ConsumerProtocolMemberAssignment.decode(member[-1])
                    assigned = [
                        TopicPartition(tp.topic, tp.partition) for tp in decoded.partitions()
                    ]
                members.append(
                    GroupMember(str(member[0]), str(member[-4]), str(member[-3]), assigned)
                )
    return state, members


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, ownership: KafkaOwnership) -> None:
        self._ownership = ownership

    async def on_partitions_revoked(self, revoked: set[KafkaTP]) -> None:
        try:
            await self._ownership._revoked(revoked)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("draining revoked partitions failed")

    async def on_partitions_assigned(self, assigned: set[KafkaTP]) -> None:
        try:
            await self._ownership._assigned(assigned)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("starting assigned partitions failed")
