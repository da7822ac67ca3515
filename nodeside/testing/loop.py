"""``VirtualTimeLoop``: an asyncio event loop on a virtual clock, for the daemon in memory.

When nothing is ready to run, the loop does not wait: it moves its clock to the next timer. So
the daemon's timers (quanta, grace periods, coalesced ``changed`` rounds) fire in order and on
time, to the microsecond, however slow or busy the machine; and a loop that would wait for
ever, nothing ready and no timer armed, is a ``Stuck`` error instead of a hang.
"""

from __future__ import annotations

import asyncio
import selectors
from typing import Any


class Stuck(AssertionError):
    """The loop would wait for ever: nothing is ready and no timer is armed."""


class _VirtualSelector(selectors.BaseSelector):
    """A real selector (the loop's self-pipe is real) that never waits: where the loop would
    sleep until its next timer, the loop's virtual clock moves there instead."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        self._loop = loop
        self._real = selectors.DefaultSelector()
        #: Resolved (instead of moving the clock) the next time the loop would wait.
        self.idle: asyncio.Future[None] | None = None

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def get_map(self) -> Any:
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        events = self._real.select(0)
        if events or timeout == 0:
            return events
        if self.idle is not None and not self.idle.done():
            self.idle.set_result(None)  # the loop runs its callback next, at this same time
            return []
        if timeout is None:
            raise Stuck("the daemon's loop would wait for ever: nothing is ready and no timer "
                        "is armed")
        self._loop.advance(timeout)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose ``time()`` moves only when it would otherwise wait."""

    def __init__(self, start: float = 1000.0) -> None:
        self._virtual_now = start
        self.selector = _VirtualSelector(self)
        super().__init__(selector=self.selector)

    def time(self) -> float:
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        self._virtual_now += seconds

    def run_in_executor(  # type: ignore[override]  # typeshed's needs TypeVarTuple (3.11)
            self, executor: Any, func: Any, *args: Any) -> asyncio.Future[Any]:
        """Runs ``func`` here and now, at this virtual time: a worker thread would finish in
        real time, which this loop does not wait for (a busy machine would decide the outcome).
        The daemon's blocking reads (NVML) are quick."""
        future: asyncio.Future[Any] = self.create_future()
        try:
            future.set_result(func(*args))
        except BaseException as exc:  # noqa: BLE001 - the caller's await raises it, as a thread's would
            future.set_exception(exc)
        return future

    def settle(self) -> None:
        """Run everything ready now, and what that makes ready, without moving the clock."""
        idle = self.create_future()
        self.selector.idle = idle
        try:
            self.run_until_complete(idle)
        finally:
            self.selector.idle = None
