"""A block worker's idle/busy gate: which of its partitions the next cycle reads, and, when there
is nothing to read, the wait for a writer's wake-up or the sweep.

The block is *idle* (it has declared its partitions waiting, writers wake it with NOTIFY or a
change-stream event) or *busy* (it reads every partition each cycle and writers notify nobody):
a busy relay costs writers nothing. An idle block turns busy after :data:`BUSY_AFTER` cycles in
a row that found records; a busy one turns idle after :data:`IDLE_AFTER` empty cycles in a row.
Wake-ups are hints: an idle block still reads everything every ``sweep_interval``.

What the block believes about its declaration is checked against the storage: at each sweep and
after every reconnect of the listener it declares itself again, and a declaration the storage no
longer had (PostgreSQL's unlogged ``outboxkit.relay_waiting`` is empty after a crash restart or
on a promoted standby) is reported, as are sweeps that keep finding records no wake-up
announced (:mod:`outboxkit.relay.degraded`). Without this, a relay that writers stopped waking
stays a sweep-interval poller, silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from outboxkit.core.waiting import wait_set
from outboxkit.relay.degraded import MissedWakeups
from outboxkit.relay.exceptions import StorageUnavailableError
from outboxkit.relay.metrics import RelayMetrics
from outboxkit.relay.records import TopicPartition
from outboxkit.relay.settings import RelaySettings
from outboxkit.relay.storage import WakeupSource

#: Going idle, a block waits (polling with backoff, at most this long) until every writer
#: transaction open at its declaration has ended, then looks once more (see _await_writers).
WRITERS_WAIT_MAX = 1.0

#: An idle (waiting) block turns busy after this many cycles in a row that found records (it
#: is never left waiting: writers need not notify it); a busy block turns idle after this many
#: empty cycles in a row.
BUSY_AFTER = 8
IDLE_AFTER = 3


@dataclass(eq=False)
class IdleGate:
    """The partitions of one block that may have records (to read next), and its idle/busy
    state."""

    tps: Sequence[TopicPartition]
    wakeups: WakeupSource
    metrics: RelayMetrics
    settings: RelaySettings  #: sweep_interval
    stop: asyncio.Event
    #: The relay's record of wake-ups it missed (shared by its blocks' gates).
    missed: MissedWakeups
    _wake: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    _dirty: set[TopicPartition] = field(default_factory=set, init=False)
    _waiting: bool = field(default=False, init=False)
    _streak: int = field(default=0, init=False)
    _empty: int = field(default=0, init=False)
    _woken_at: float | None = field(default=None, init=False)
    #: Declare again at the next rest: the listener reconnected (the database may have
    #: restarted or failed over, and lost the declaration with it).
    _redeclare: bool = field(default=False, init=False)
    #: The last wait ended with the sweep; the cycle now running is its read.
    _swept: bool = field(default=False, init=False)
    _sweep_cycle: bool = field(default=False, init=False)
    #: Sweeps in a row that found records no wake-up announced.
    _unannounced: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self._dirty = set(self.tps)  # look at everything first

    @property
    def waiting(self) -> bool:
        """Idle: the partitions are declared waiting, writers wake this block."""
        return self._waiting

    @property
    def due(self) -> bool:
        """Some partition may have records: the next cycle reads."""
        return bool(self._dirty)

    def wake(self, tp: TopicPartition | None) -> None:
        """A writer committed rows of ``tp`` (``None``: maybe any partition)."""
        self.look_again(None if tp is None else (tp,))
        if tp is not None:
            self._unannounced = 0
            self.missed.announced()
        if self._woken_at is None:
            self._woken_at = time.perf_counter()
        self._wake.set()

    def reconnected(self) -> None:
        """The listener (or change stream) reconnected: wake-ups sent meanwhile are lost, and
        the database may have lost the declaration too. Read everything, and declare again
        before waiting."""
        self._redeclare = True
        self.look_again()
        self._wake.set()

    def interrupt(self) -> None:
        """End a wait now (the worker is stopping)."""
        self._wake.set()

    def look_again(self, tps: Iterable[TopicPartition] | None = None) -> None:
        """Read ``tps`` (``None``: every partition of the block) in the next cycle."""
        self._dirty.update(self.tps if tps is None else tps)

    def take(self) -> tuple[set[TopicPartition], float | None]:
        """The partitions this cycle reads (busy: all of them), and when the wake-up that led
        to it arrived (:func:`time.perf_counter`, ``None`` if none did)."""
        look = self._dirty if self._waiting else set(self.tps)
        self._dirty = set()
        self._wake.clear()
        self._sweep_cycle, self._swept = self._swept, False
        woken_at, self._woken_at = self._woken_at, None
        return look, woken_at

    async def rest(self) -> None:
        """Nothing to read: declare the block idle (the first time), or wait for a wake-up or
        the sweep."""
        if not self._waiting:
            # Declare idle, then look once more when the writers that may have missed the
            # declaration are done: they sent no notification.
            self._waiting = await self._set_waiting(True) is not None
            self._streak = 0
            await self._await_writers()
            self.look_again()
            return
        if self._redeclare:
            self._redeclare = False
            await self._declare_again()
            return
        reason = await self._wait(self.settings.sweep_interval)
        if reason == "sweep":
            self._swept = True
            await self._declare_again()
        self.metrics.wakeups.labels(reason).inc()

    async def _declare_again(self) -> None:
        """Declare the block waiting again (it believes it is) and read everything: if the
        storage no longer had the declaration, writers have not been waking it, so report
        that and wait for those who may have missed the new one first."""
        self.look_again()
        missing = await self._set_waiting(True)
        if missing is None:
            self._redeclare = True  # the database did not answer: at the next rest
        elif missing:
            self.missed.declaration_lost(self.tps)
            await self._await_writers()

    async def after_cycle(self, found: bool) -> None:
        """Switch between idle (declared, woken by writers) and busy (reading every cycle)."""
        if self._waiting:
            if found and self._sweep_cycle:
                self._unannounced += 1
                self.missed.unannounced(self.tps, self._unannounced)
            self._streak = self._streak + 1 if found else 0
            if self._streak >= BUSY_AFTER:
                try:
                    await self.wakeups.set_waiting(self.tps, False)
                except StorageUnavailableError:
                    return
                self._waiting, self._empty = False, 0
        elif found:
            self._empty = 0
        else:
            self._empty += 1
            if self._empty < IDLE_AFTER:
                self.look_again()  # poll again, paced

    async def leave(self) -> None:
        """Stopping: writers need not wake this block any more."""
        if self._waiting:
            with contextlib.suppress(Exception):
                await self.wakeups.set_waiting(self.tps, False)
            self._waiting = False

    async def _set_waiting(self, waiting: bool) -> int | None:
        """How many of the block's partitions the storage changed; None if it did not answer
        (no wake-ups then: the sweep still runs)."""
        try:
            return await self.wakeups.set_waiting(self.tps, waiting) or 0
        except StorageUnavailableError:
            return None

    async def _await_writers(self) -> None:
        """Until every writer transaction that was open when the block was declared idle has
        ended (its trigger may have run before the declaration was visible, so it sent no
        wake-up; its row is visible afterwards), a wake-up arrives, or a bound passes (a long
        transaction elsewhere on the server holds the horizon back: the sweep covers it)."""
        delay, deadline = 0.002, time.monotonic() + WRITERS_WAIT_MAX
        while not self.stop.is_set() and time.monotonic() < deadline:
            try:
                if await self.wakeups.earlier_writers_ended(self.tps):
                    return
            except StorageUnavailableError:
                return  # the next read fails too and is retried
            if await self._wait(delay) == "notify":
                return
            delay = min(delay * 2, 0.1)

    async def _wait(self, seconds: float) -> str:
        return "notify" if await wait_set(self._wake, seconds) else "sweep"
