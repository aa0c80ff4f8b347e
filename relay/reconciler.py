"""Which block workers run: the partitions this relay owns, grouped into blocks, one worker each.

The group assigns and revokes partitions (:mod:`outboxkit.relay.ownership`); the reconciler
keeps one running :class:`~outboxkit.relay.worker.BlockWorker` per block of the plan
(:func:`outboxkit.relay.blocks.plan`): a block that leaves the plan is stopped and drained
(bounded by ``revoke_timeout``) before the blocks that replace it start, so that two producers
never publish one partition from this relay (G4). A worker that failed unexpectedly is restarted
after a backoff (G8: never a crash loop, a poison partition blocks only itself).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import structlog

from outboxkit.core.waiting import await_cancelled
from outboxkit.relay.blocks import Block, plan
from outboxkit.relay.metrics import RelayMetrics
from outboxkit.relay.records import TopicPartition
from outboxkit.relay.settings import RelaySettings
from outboxkit.relay.worker import BlockWorker

logger = structlog.get_logger("outboxkit.relay")

#: Makes the (not yet started) worker of a block and its partitions.
WorkerFactory = Callable[[Block, list[TopicPartition]], BlockWorker]

__all__ = ["CrashBackoff", "PartitionReconciler", "WorkerFactory"]


class CrashBackoff:
    """How long a block waits before its failed worker restarts: ``first`` seconds, then twice
    as long after each further failure, up to ``longest``; failures more than ``memory``
    seconds apart count as the first again."""

    def __init__(self, first: float = 0.5, longest: float = 30.0, memory: float = 300.0) -> None:
        self.first, self.longest, self.memory = first, longest, memory
        #: Per block: consecutive unexpected failures, and when the last one was.
        self._crashes: dict[Block, tuple[int, float]] = {}

    def failed(self, block: Block, now: float) -> tuple[int, float]:
        """Count a failure of ``block`` at ``now`` (monotonic): its consecutive failures, and
        the delay before its restart."""
        failures, last = self._crashes.get(block, (0, now))
        failures = 1 if now - last > self.memory else failures + 1
        self._crashes[block] = (failures, now)
        return failures, min(self.first * 2 ** (failures - 1), self.longest)


class PartitionReconciler:
    """Owned partitions → blocks → running workers, changed under one lock per assignment,
    revocation or restart."""

    def __init__(
        self,
        settings: RelaySettings,
        metrics: RelayMetrics,
        new_worker: WorkerFactory,
        on_error: Callable[[BaseException], None],
        backoff: CrashBackoff | None = None,
    ) -> None:
        self._settings = settings
        self._metrics = metrics
        self._new_worker = new_worker
        self._on_error = on_error
        #: Each topic's partition count, as the group last told it.
        self.counts: dict[str, int] = {}
        self._owned: set[TopicPartition] = set()
        self._workers: dict[Block, BlockWorker] = {}
        self._by_tp: dict[TopicPartition, BlockWorker] = {}
        self._lock = asyncio.Lock()
        self._backoff = backoff or CrashBackoff()
        self._restarts: dict[Block, asyncio.TimerHandle] = {}
        self._restarting: set[asyncio.Task[None]] = set()
        self._halted = False

    @property
    def owned(self) -> frozenset[TopicPartition]:
        return frozenset(self._owned)

    @property
    def workers(self) -> list[BlockWorker]:
        """The workers of the current blocks (a failed one until it restarts)."""
        return list(self._workers.values())

    def worker_of(self, tp: TopicPartition) -> BlockWorker | None:
        return self._by_tp.get(tp)

    @property
    def crashed(self) -> set[TopicPartition]:
        """Owned partitions whose worker failed unexpectedly and waits to be restarted."""
        return {
            tp
            for w in self._workers.values()
            if w.block in self._restarts
            for tp in w.tps
            if tp in self._owned
        }

    async def assign(self, partitions: frozenset[TopicPartition]) -> None:
        """Publish ``partitions`` too (and restart any block whose worker is not alive); once
        halted, nothing: an assignment that completes while the stopping relay leaves its group
        (a stop during its join) must not start a worker that outlives the relay's pools."""
        if self._halted:
            return
        async with self._lock:
            self._owned |= partitions
            await self._reconcile()

    async def revoke(self, partitions: frozenset[TopicPartition]) -> None:
        """Stop publishing ``partitions``; wait for their in-flight batch (bounded)."""
        async with self._lock:
            self._owned -= partitions
            await self._reconcile()

    def halt(self) -> None:
        """Restart no failed worker any more (the relay is stopping)."""
        self._halted = True
        for restart in self._restarts.values():
            restart.cancel()
        self._restarts.clear()
        for task in self._restarting:
            task.cancel()

    async def close(self) -> None:
        """:meth:`halt`, then stop every worker, draining its in-flight batch (bounded)."""
        self.halt()
        await await_cancelled(list(self._restarting))
        await self.revoke(self.owned)

    async def _reconcile(self) -> None:
        desired = plan(self._owned, self.counts, self._settings.max_block_level)
        wanted = set(desired)
        leaving = [w for block, w in self._workers.items() if block not in wanted]
        for worker in leaving:
            del self._workers[worker.block]
            worker.request_stop()
        await self._drain(leaving)
        for block in desired:
            current = self._workers.get(block)
            if current is not None and current.alive:
                continue
            worker = self._new_worker(block, block.partitions(self.counts.get(block.topic, 0)))
            worker.task = asyncio.create_task(worker.run(), name=f"block {block}")
            worker.task.add_done_callback(self._on_worker_done)
            self._workers[block] = worker
        self._by_tp = {tp: w for w in self._workers.values() for tp in w.tps}
        self._metrics.owned_partitions.set(len(self._owned))

    async def _drain(self, workers: list[BlockWorker]) -> None:
        tasks = [w.task for w in workers if w.task is not None]
        if not tasks:
            return
        _, late = await asyncio.wait(tasks, timeout=self._settings.revoke_timeout)
        for task in late:
            logger.warning(
                "partitions did not drain in time, abandoning them", task=task.get_name()
            )
            task.cancel()
        await await_cancelled(tasks)

    def _on_worker_done(self, task: asyncio.Task[None]) -> None:
        """A worker that failed unexpectedly (a bug, or data no handler foresaw) is logged with
        its partitions, shown on the health (:attr:`crashed`), and restarted after a backoff
        that grows with its block's consecutive failures: the relay never exits for it, and
        the other blocks go on."""
        if task.cancelled() or task.exception() is None or self._halted:
            return
        error = task.exception()
        assert error is not None
        worker = next((w for w in self._workers.values() if w.task is task), None)
        if worker is None:
            return
        block = worker.block
        failures, delay = self._backoff.failed(block, time.monotonic())
        self._on_error(error)
        self._metrics.publish_errors.labels(block.topic, "crashed").inc()
        logger.error(
            "partition worker failed unexpectedly; restarting it",
            block=str(block),
            partitions=[str(tp) for tp in worker.tps],
            failures=failures,
            restart_in=delay,
            exc_info=error,
        )
        restart = asyncio.get_running_loop().call_later(delay, self._restart_soon, block)
        self._restarts[block] = restart

    def _restart_soon(self, block: Block) -> None:
        self._restarts.pop(block, None)
        if not self._halted:
            restarted = asyncio.create_task(self._restart(), name=f"restart {block}")
            self._restarting.add(restarted)
            restarted.add_done_callback(self._restarting.discard)

    async def _restart(self) -> None:
        """Start again every owned block whose worker is not alive (:meth:`_reconcile`)."""
        async with self._lock:
            if not self._halted:
                await self._reconcile()
