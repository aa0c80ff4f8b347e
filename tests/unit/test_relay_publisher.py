"""The relay's producer: aiokafka's, with one retry shortened, and only for the relay.

relay/publisher.py used to set aiokafka's module-global ``sender.BACKOFF_OVERRIDE`` at import,
changing every producer of the process. Now a subclass swaps in a sender whose
AddPartitionsToTxn handler retries sooner after CONCURRENT_TRANSACTIONS. If an aiokafka upgrade
moves the internals it relies on, these tests fail instead of bringing back 20 ms per
transaction without a word.
"""

from __future__ import annotations

import asyncio
import gc
from types import SimpleNamespace
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka import TopicPartition as KafkaTP
from aiokafka.errors import (
    ConcurrentTransactions,
    CoordinatorLoadInProgressError,
    ProducerFenced,
)
from aiokafka.producer import sender

from outboxkit.relay import publisher
from outboxkit.relay.publisher import CONCURRENT_TRANSACTIONS_BACKOFF, RelayProducer


def _response(code: int) -> SimpleNamespace:
    return SimpleNamespace(errors=[("orders", [(0, code)])])


async def test_only_the_relays_producers_retry_concurrent_transactions_sooner() -> None:
    assert sender.BACKOFF_OVERRIDE == 0.02  # aiokafka's own value: no global patch
    ours = RelayProducer(bootstrap_servers="localhost:1", transactional_id="t", acks="all")
    plain = AIOKafkaProducer(bootstrap_servers="localhost:1", transactional_id="t2", acks="all")
    try:
        assert isinstance(ours._sender, publisher._Sender)
        assert type(plain._sender) is sender.Sender
        # The swapped sender carries what aiokafka built.
        assert ours._sender._txn_manager.transactional_id == "t"
        assert ours._sender._acks == -1

        handler = publisher._AddPartitionsHandler(ours._sender, [])
        concurrent = _response(ConcurrentTransactions.errno)
        assert handler.handle_response(concurrent) == CONCURRENT_TRANSACTIONS_BACKOFF
        stock = sender.AddPartitionsToTxnHandler(plain._sender, [])
        assert stock.handle_response(concurrent) == sender.BACKOFF_OVERRIDE
    finally:
        await ours.stop()
        await plain.stop()


async def test_other_answers_keep_aiokafkas_handling() -> None:
    ours = RelayProducer(bootstrap_servers="localhost:1", transactional_id="t", acks="all")
    try:
        handler = publisher._AddPartitionsHandler(ours._sender, [])
        loading = _response(CoordinatorLoadInProgressError.errno)
        assert handler.handle_response(loading) == ours._sender._retry_backoff
    finally:
        await ours.stop()


async def test_a_fenced_producer_leaves_no_unretrieved_error_behind() -> None:
    """A fence is reported once by the relay; aiokafka's stored copies of the error (each
    pending batch's drain waiter, the transaction waiter) must not surface later as "Future
    exception was never retrieved" with a traceback."""
    reported: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _, context: reported.append(context))
    producer = RelayProducer(bootstrap_servers="localhost:1", acks="all", linger_ms=10_000)
    for partition in (0, 1):  # a block's batches, waiting to be sent
        sent = await producer._message_accumulator.add_message(
            KafkaTP("orders", partition), b"k", b"v", timeout=1, timestamp_ms=0
        )
        sent.add_done_callback(publisher._retrieve)  # as KafkaPublisher does with every send
    transactional = RelayProducer(bootstrap_servers="localhost:1", transactional_id="t")
    # A transaction is open: the fence (fatal_error) stores the error in its waiter.
    transactional._txn_manager._transaction_waiter = loop.create_future()
    failed_sender = loop.create_future()
    failed_sender.set_exception(ProducerFenced())
    for each in (producer, transactional):
        each._sender._fail_all(failed_sender)  # the sender routine ended, fenced
        await each.stop()
    del producer, transactional, each, sent
    gc.collect()
    assert [c["message"] for c in reported] == []
