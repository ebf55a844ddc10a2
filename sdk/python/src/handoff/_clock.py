"""The Agent's clock: terms of leadership and the age of claims are timed on it.

A :class:`Clock` gives the monotonic time (terms end on it, whatever the wall
clock does), the wall time (a grant's ``until`` and ``sequence`` are wall
times on the sidecar's clock, which is the node's) and timers. Tests pass
:class:`handoff.testing.FakeClock`.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from typing import Callable, List, Optional, Tuple

from typing import Protocol

__all__ = ["Clock", "Timer", "RealClock", "REAL_CLOCK"]


class Timer(Protocol):
    """A callback scheduled by :meth:`Clock.call_later`."""

    def cancel(self) -> bool:
        """Stop it; True if it had not run yet."""


class Clock(Protocol):
    """What the Agent reads the time from."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (:func:`time.monotonic`)."""

    def time(self) -> float:
        """The Unix time in seconds (:func:`time.time`)."""

    def call_later(self, delay: float, fn: Callable[[], None]) -> Timer:
        """Run ``fn`` once ``delay`` seconds have passed on :meth:`monotonic`, in a thread of the clock's."""


class _Entry:
    __slots__ = ("fn", "done")

    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn: Optional[Callable[[], None]] = fn
        self.done = False


class _RealTimer:
    def __init__(self, clock: "RealClock", entry: _Entry) -> None:
        self._clock = clock
        self._entry = entry

    def cancel(self) -> bool:
        with self._clock._cond:
            if self._entry.done:
                return False
            self._entry.done = True
            self._entry.fn = None
            return True


class RealClock:
    """The process's clocks; timers run in one daemon thread, started at the first."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: List[Tuple[float, int, _Entry]] = []
        self._seq = itertools.count()
        self._thread: Optional[threading.Thread] = None

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    def call_later(self, delay: float, fn: Callable[[], None]) -> Timer:
        e = _Entry(fn)
        with self._cond:
            heapq.heappush(self._heap, (time.monotonic() + max(delay, 0.0), next(self._seq), e))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="handoff-timers", daemon=True)
                self._thread.start()
            self._cond.notify()
        return _RealTimer(self, e)

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    while self._heap and self._heap[0][2].done:
                        heapq.heappop(self._heap)
                    if not self._heap:
                        self._cond.wait()
                        continue
                    at = self._heap[0][0]
                    now = time.monotonic()
                    if at <= now:
                        _, _, e = heapq.heappop(self._heap)
                        fn, e.fn, e.done = e.fn, None, True
                        break
                    self._cond.wait(min(at - now, 3600.0))
            if fn is not None:
                try:
                    fn()
                except Exception:  # pragma: no cover - the Agent's callbacks do not raise
                    import logging

                    logging.getLogger("handoff").exception("timer callback failed")


#: The clock every Agent uses unless given another.
REAL_CLOCK = RealClock()
