"""Probes of consumer groups: join, rebalance on join, clean leave and a killed member (a child
process), paused members, a member that stops polling, KIP-848."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener

from bench.broker_probes.children import spawn_child
from bench.broker_probes.harness import (
    FAIL,
    INFO,
    OK,
    Ctx,
    ProbeFailed,
    create_topic,
    describe,
    new_consumer,
    new_producer,
    running,
    since,
    stop_quietly,
    wait_until,
)

# --------------------------------------------------------------------------- consumer groups


@dataclass
class Member:
    """An in-process group member that keeps polling and logs its rebalance callbacks."""

    name: str
    consumer: AIOKafkaConsumer
    log: list[str]
    t0: float
    assigned: set[int] = field(default_factory=set)
    task: asyncio.Task[None] | None = None
    polling: bool = True
    polls: int = 0
    last_poll: float = 0.0

    async def run(self) -> None:
        while True:
            if self.polling:
                await self.consumer.getmany(timeout_ms=200)
                self.polls += 1
                self.last_poll = time.monotonic()
            else:
                await asyncio.sleep(0.01)


class Recorder(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, member: Member) -> None:
        self.member = member

    def _note(self, what: str, tps: Iterable[TopicPartition]) -> list[int]:
        parts = sorted(tp.partition for tp in tps)
        self.member.log.append(f"{since(self.member.t0):6.2f}s {self.member.name}.{what}{parts}")
        return parts

    async def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        self._note("revoked", revoked)
        self.member.assigned = set()

    async def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        tps = list(assigned)
        self.member.assigned = set(self._note("assigned", tps))


@dataclass(frozen=True)
class GroupCfg:
    name: str
    session_ms: int
    heartbeat_ms: int

    def kwargs(self) -> dict[str, int]:
        return {"session_timeout_ms": self.session_ms, "heartbeat_interval_ms": self.heartbeat_ms}


FAST = GroupCfg("session6000/hb500", 6000, 500)
DEFAULTS = GroupCfg("defaults(session10000/hb3000)", 10000, 3000)


@dataclass
class Spot:
    """Where a group scenario happens: its topic, group and shared callback log."""

    topic: str
    group_id: str
    log: list[str] = field(default_factory=list)
    t0: float = field(default_factory=time.monotonic)


async def start_member(ctx: Ctx, spot: Spot, name: str, cfg: GroupCfg, **kw: Any) -> Member:
    consumer = new_consumer(ctx.bootstrap, group_id=spot.group_id, **cfg.kwargs(), **kw)
    member = Member(name, consumer, spot.log, spot.t0)
    consumer.subscribe([spot.topic], listener=Recorder(member))
    try:
        await consumer.start()
    except BaseException:
        await stop_quietly(consumer)
        raise
    member.task = asyncio.create_task(member.run())
    return member


async def stop_polling(member: Member) -> None:
    if member.task is not None:
        member.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await member.task
        member.task = None


async def stop_member(member: Member) -> None:
    await stop_polling(member)
    await stop_quietly(member.consumer)


async def new_spot(ctx: Ctx, probe: str, partitions: int) -> Spot:
    topic = await create_topic(ctx, probe, partitions=partitions)
    return Spot(topic, f"okbench-{ctx.run_id}-{probe}-{uuid.uuid4().hex[:6]}")


async def probe_group(ctx: Ctx, cfg: GroupCfg) -> None:
    spot = await new_spot(ctx, "group", 4)
    t0 = time.monotonic()
    first = await start_member(ctx, spot, "m1", cfg)
    second: Member | None = None
    try:
        started = since(t0)
        await wait_until(lambda: first.assigned == {0, 1, 2, 3}, 60, "m1 assignment")
        detail = f"consumer.start() returned after {started:.2f}s; on_partitions_assigned[0..3]"
        ctx.add(f"group_first_join [{cfg.name}]", OK, since(t0), detail)
        second = await group_second_join(ctx, cfg, first, spot)
        await describe_group(ctx, cfg, spot.group_id)
        await group_clean_leave(ctx, cfg, first, second)
        await group_killed_member(ctx, cfg, first, spot)
    finally:
        if second is not None:
            await stop_member(second)
        await stop_member(first)
        ctx.add(f"group_callback_log [{cfg.name}]", INFO, since(spot.t0), " | ".join(spot.log))


async def group_second_join(ctx: Ctx, cfg: GroupCfg, first: Member, spot: Spot) -> Member:
    t0 = time.monotonic()
    second = await start_member(ctx, spot, "m2", cfg)
    await wait_until(
        lambda: len(first.assigned) == 2 and first.assigned | second.assigned == {0, 1, 2, 3},
        60,
        "2-way split",
    )
    detail = (
        f"m2.start() -> both assigned 2+2 "
        f"(m1 {sorted(first.assigned)}, m2 {sorted(second.assigned)})"
    )
    ctx.add(f"group_rebalance_on_join [{cfg.name}]", OK, since(t0), detail)
    return second


async def describe_group(ctx: Ctx, cfg: GroupCfg, group_id: str) -> None:
    t0 = time.monotonic()
    err: BaseException | None = None
    try:
        responses = await asyncio.wait_for(ctx.admin.describe_consumer_groups([group_id]), 15)
        groups = [g for resp in responses for g in resp.groups]
        detail = "; ".join(
            f"error={g[0]} state={g[2]} protocol_type={g[3]} assignor={g[4]} members={len(g[5])}"
            for g in groups
        )
    except Exception as exc:
        err = exc
        detail = describe(exc)
    ctx.add(f"group_describe [{cfg.name}]", OK if err is None else FAIL, since(t0), detail)


async def group_clean_leave(ctx: Ctx, cfg: GroupCfg, first: Member, second: Member) -> None:
    t0 = time.monotonic()
    await stop_member(second)
    stopped = since(t0)
    await wait_until(lambda: first.assigned == {0, 1, 2, 3}, 60, "m1 to get all after m2.stop()")
    detail = f"m2.stop() took {stopped:.2f}s; m1 has [0..3] again"
    ctx.add(f"group_rebalance_on_clean_leave [{cfg.name}]", OK, since(t0), detail)


async def group_killed_member(ctx: Ctx, cfg: GroupCfg, first: Member, spot: Spot) -> None:
    session, hb = str(cfg.session_ms), str(cfg.heartbeat_ms)
    child = await spawn_child(ctx, "member", spot.topic, spot.group_id, session, hb)
    try:
        await child.expect("assigned")
        await wait_until(lambda: len(first.assigned) == 2, 60, "split with child member")
        await asyncio.sleep(cfg.heartbeat_ms / 1000 + 0.2)  # the child has heartbeated
        os.kill(child.pid, signal.SIGKILL)
        took = await wait_until(lambda: first.assigned == {0, 1, 2, 3}, 120, "m1 after SIGKILL")
    finally:
        await child.close()
    detail = (
        f"SIGKILL child member -> m1 has [0..3] after {took:.2f}s "
        f"(session_timeout_ms {cfg.session_ms})"
    )
    ctx.add(f"group_rebalance_on_killed_member [{cfg.name}]", OK, took, detail)


def count_revokes(log: Sequence[str]) -> int:
    return sum(1 for line in log if ".revoked[" in line and ".revoked[]" not in line)


async def probe_paused(ctx: Ctx) -> None:
    """A member whose partitions are all paused keeps polling: does it keep its assignment?"""
    spot = await new_spot(ctx, "paused", 2)
    member = await start_member(ctx, spot, "p1", FAST, max_poll_interval_ms=3000)
    other: Member | None = None
    try:
        await wait_until(lambda: member.assigned == {0, 1}, 60, "p1 assignment")
        await stop_polling(member)
        member.consumer.pause(*member.consumer.assignment())
        await feed(ctx, spot.topic, 2)
        await hold_paused(ctx, member, 2.5 * FAST.session_ms / 1000)
        other = await paused_rebalance(ctx, member, spot)
    finally:
        if other is not None:
            await stop_member(other)
        await stop_member(member)
        ctx.add("paused_callback_log", INFO, since(spot.t0), " | ".join(spot.log))


async def hold_paused(ctx: Ctx, member: Member, hold: float) -> None:
    t0 = time.monotonic()
    revokes = count_revokes(member.log)
    while since(t0) < hold:
        got = await member.consumer.getmany(timeout_ms=500)
        if got:
            raise ProbeFailed(f"paused consumer returned records: {got}")
    kept = member.assigned == {0, 1} and count_revokes(member.log) == revokes
    paused = sorted(tp.partition for tp in member.consumer.paused())
    detail = (
        f"all partitions paused, getmany(timeout_ms=500) loop for {hold:.0f}s "
        f"(2.5x session_timeout_ms=6000, max_poll_interval_ms=3000): no revoke={kept}, "
        f"still assigned {sorted(member.assigned)}, paused={paused}, no records returned"
    )
    ctx.add("paused_member_keeps_assignment", OK if kept else FAIL, since(t0), detail)


async def feed(ctx: Ctx, topic: str, partitions: int) -> None:
    async with running(new_producer(ctx)) as producer:
        for p in range(partitions):
            await producer.send_and_wait(topic, b"x", partition=p)


async def paused_rebalance(ctx: Ctx, member: Member, spot: Spot) -> Member:
    """After a rebalance, are the partitions handed back to a paused member still paused?"""
    member.task = asyncio.create_task(member.run())
    t0 = time.monotonic()
    other = await start_member(ctx, spot, "p2", FAST)
    await wait_until(lambda: len(member.assigned) == 1 and len(other.assigned) == 1, 60, "split")
    paused = sorted(tp.partition for tp in member.consumer.paused())
    held = sorted(member.assigned)
    detail = (
        f"after a rebalance p1 holds {held}, consumer.paused()={paused}: pause state is "
        "NOT kept across a rebalance (re-pause in on_partitions_assigned)"
        if not paused
        else f"after a rebalance p1 holds {held}, still paused {paused}"
    )
    ctx.add("paused_state_after_rebalance", INFO, since(t0), detail)
    return other


async def probe_no_poll(ctx: Ctx) -> None:
    """A member that stops calling getmany for longer than max_poll_interval_ms."""
    spot = await new_spot(ctx, "nopoll", 1)
    member = await start_member(ctx, spot, "n1", FAST, max_poll_interval_ms=3000)
    try:
        await wait_until(lambda: member.assigned == {0}, 60, "n1 assignment")
        polls = member.polls
        await wait_until(lambda: member.polls > polls, 10, "a getmany after assignment")
        member.polling = False
        await wait_until(lambda: not member.assigned, 15, "revocation")
        lost = time.monotonic() - member.last_poll
        member.polling = True
        back = await wait_until(lambda: member.assigned == {0}, 30, "rejoin")
    finally:
        await stop_member(member)
    detail = (
        f"max_poll_interval_ms=3000: on_partitions_revoked {lost:.2f}s after the last getmany, "
        f"re-assigned {back:.2f}s after polling resumed; {' | '.join(spot.log)}"
    )
    ctx.add("not_polling_leaves_group", INFO, since(spot.t0), detail)


async def probe_kip848(ctx: Ctx) -> None:
    t0 = time.monotonic()
    try:
        AIOKafkaConsumer(bootstrap_servers=ctx.bootstrap, group_protocol="consumer")
    except TypeError as exc:
        detail = (
            f"AIOKafkaConsumer(group_protocol='consumer') -> {describe(exc)}; classic protocol only"
        )
        ctx.add("kip848_group_protocol", INFO, since(t0), detail)
        return
    ctx.add("kip848_group_protocol", INFO, since(t0), "group_protocol accepted by aiokafka")
