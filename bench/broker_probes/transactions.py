"""Probes of transactions: commit and abort, read_committed, fencing a producer between
transactions and while frozen with an open one (a child process), an abandoned transaction."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence

from aiokafka import AIOKafkaProducer

from bench.broker_probes.children import spawn_child
from bench.broker_probes.harness import (
    FAIL,
    OK,
    Ctx,
    create_topic,
    describe,
    new_producer,
    outcome,
    read_until,
    show,
    since,
    stop_quietly,
)

# --------------------------------------------------------------------------- transactions


async def run_txn(
    producer: AIOKafkaProducer, topic: str, values: Sequence[bytes], commit: bool
) -> None:
    await producer.begin_transaction()
    for value in values:
        await producer.send_and_wait(topic, value)
    if commit:
        await producer.commit_transaction()
    else:
        await producer.abort_transaction()


async def probe_transactions(ctx: Ctx) -> None:
    topic = await create_topic(ctx, "txn")
    t0 = time.monotonic()
    producer = new_producer(ctx, transactional_id=f"okbench-{ctx.run_id}-txn")
    try:
        await producer.start()
        init = since(t0)
        t1 = time.monotonic()
        await run_txn(producer, topic, [b"c1", b"c2"], commit=True)
        commit_s = since(t1)
        await run_txn(producer, topic, [b"a1"], commit=False)
        await run_txn(producer, topic, [b"c3", b"END"], commit=True)
    finally:
        await stop_quietly(producer)
    ctx.add("txn_commit_abort", OK, since(t0), f"init {init:.2f}s, 2-record commit {commit_s:.2f}s")
    await check_isolation(ctx, topic)


async def check_isolation(ctx: Ctx, topic: str) -> None:
    t0 = time.monotonic()
    committed = await read_until(ctx, topic, b"END", "read_committed")
    status = OK if committed.values == [b"c1", b"c2", b"c3", b"END"] else FAIL
    ctx.add("read_committed", status, since(t0), f"sees {show(committed.values)}")
    t0 = time.monotonic()
    uncommitted = await read_until(ctx, topic, b"END", "read_uncommitted")
    status = OK if uncommitted.values == [b"c1", b"c2", b"a1", b"c3", b"END"] else FAIL
    ctx.add("read_uncommitted", status, since(t0), f"sees {show(uncommitted.values)}")


async def probe_fencing_between(ctx: Ctx) -> None:
    """Old producer A between transactions; B (same transactional_id) initialises."""
    topic = await create_topic(ctx, "fence")
    txid = f"okbench-{ctx.run_id}-fence"
    old = new_producer(ctx, transactional_id=txid)
    new = new_producer(ctx, transactional_id=txid)
    t0 = time.monotonic()
    try:
        await old.start()
        await run_txn(old, topic, [b"a1"], commit=True)
        t1 = time.monotonic()
        await new.start()
        init = since(t1)
        await old.begin_transaction()
        send_err = await outcome(old.send_and_wait(topic, b"a2-zombie"))
        commit_err = await outcome(old.commit_transaction())
        abort_err = await outcome(old.abort_transaction())
        await run_txn(new, topic, [b"b1", b"END"], commit=True)
    finally:
        await stop_quietly(old)
        await stop_quietly(new)
    detail = (
        f"B init {init:.2f}s; A.begin_transaction ok (local); A.send -> {describe(send_err)}; "
        f"A.commit -> {describe(commit_err)}; A.abort -> {describe(abort_err)}"
    )
    ctx.add("fencing_between_txns", OK if send_err else FAIL, since(t0), detail)
    read = await read_until(ctx, topic, b"END", "read_committed")
    status = OK if read.values == [b"a1", b"b1", b"END"] else FAIL
    ctx.add(
        "fencing_between_txns_visible", status, read.seconds, f"read_committed {show(read.values)}"
    )


async def probe_fencing_zombie(ctx: Ctx) -> None:
    """Producer A (child process) has an open transaction and is frozen; B takes over."""
    topic = await create_topic(ctx, "zombie")
    txid = f"okbench-{ctx.run_id}-zombie"
    child = await spawn_child(ctx, "zombie", topic, txid)
    t0 = time.monotonic()
    try:
        await child.expect("sent")
        os.kill(child.pid, signal.SIGSTOP)
        await takeover_while_frozen(ctx, topic, txid)
        os.kill(child.pid, signal.SIGCONT)
        child.send("go")
        result = await child.expect("result")
    finally:
        await child.close()
    detail = (
        f"thawed A (open txn, partition already in txn): send -> {result['send']}; "
        f"commit -> {result['commit']}; abort -> {result['abort']}"
    )
    ctx.add(
        "fencing_zombie_after_thaw", OK if result["send"] != "no error" else FAIL, since(t0), detail
    )
    await finish_and_check(ctx, topic, txid)


async def takeover_while_frozen(ctx: Ctx, topic: str, txid: str) -> None:
    new = new_producer(ctx, transactional_id=txid)
    t0 = time.monotonic()
    try:
        await new.start()
        init = since(t0)
        await run_txn(new, topic, [b"b1"], commit=True)
    finally:
        await stop_quietly(new)
    rc = await read_until(ctx, topic, b"b1", "read_committed")
    ru = await read_until(ctx, topic, b"b1", "read_uncommitted")
    aborted = rc.values == [b"b1"] and b"a1-open" in ru.values
    detail = (
        f"B init {init:.2f}s while A frozen with open txn; read_committed {show(rc.values)}, "
        f"read_uncommitted {show(ru.values)} -> A's open txn was "
        + ("ABORTED by B's init" if aborted else "NOT aborted")
    )
    ctx.add("fencing_zombie_init_aborts_open_txn", OK if aborted else FAIL, since(t0), detail)


async def finish_and_check(ctx: Ctx, topic: str, txid: str) -> None:
    new = new_producer(ctx, transactional_id=txid)
    try:
        await new.start()
        await run_txn(new, topic, [b"END"], commit=True)
    finally:
        await stop_quietly(new)
    read = await read_until(ctx, topic, b"END", "read_committed")
    status = OK if read.values == [b"b1", b"END"] else FAIL
    ctx.add("fencing_zombie_visible", status, read.seconds, f"read_committed {show(read.values)}")


async def probe_abandoned_txn(ctx: Ctx) -> None:
    """An open transaction nobody takes over: how long does it hold back read_committed?"""
    topic = await create_topic(ctx, "hang")
    hung = new_producer(
        ctx, transactional_id=f"okbench-{ctx.run_id}-hang", transaction_timeout_ms=5000
    )
    other = new_producer(ctx, transactional_id=f"okbench-{ctx.run_id}-other")
    try:
        await hung.start()
        await hung.begin_transaction()
        await hung.send_and_wait(topic, b"h1-open")
        t0 = time.monotonic()
        await other.start()
        await run_txn(other, topic, [b"END"], commit=True)
        read = await read_until(ctx, topic, b"END", "read_committed", limit=45)
        held = since(t0)
        late = await outcome(hung.commit_transaction())
    finally:
        await stop_quietly(hung)
        await stop_quietly(other)
    detail = (
        f"transaction_timeout_ms=5000: a later committed record became visible to "
        f"read_committed after {held:.1f}s (sees {show(read.values)}); "
        f"abandoned producer's commit -> {describe(late)}"
    )
    ctx.add("abandoned_txn_blocks_lso", OK if read.found else FAIL, held, detail)
