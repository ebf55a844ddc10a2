"""Helpers for testing a worker built on handoff: the fixture of ``handoff conformance``, a fake clock and a signed client of the app API.

:class:`FixtureHooks` (:class:`AsyncFixtureHooks` for :mod:`handoff.aio`)
and :func:`run_fixture` implement the fixture contract of ``handoff
conformance`` (docs/protocol.md, "The fixture contract"): the worker plugs
in how to put a message in its queue and routes the fixture's messages to
``work``; ``python3 -m handoff.testing --dir DIR --worker CMD`` is the
fixture command (``--fixture-cmd`` and ``--leader-cmd``).
:class:`FakeClock` times terms of leadership and claims without waiting
(Go: ``k8s.io/utils/clock/testing.FakeClock``); :class:`Client` makes the
calls the sidecar makes, signed with the pod's token.
"""

from __future__ import annotations

import heapq
import http.client
import itertools
import json
import socket
import sys
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple

from ._auth import sign
from ._endpoint import dial, parse_endpoint
from ._fixture import (
    FIXTURE_PREFIX,
    FIXTURE_SOCKET_ENV,
    AsyncFixtureHooks,
    FixtureHooks,
    fixture_main,
    run_fixture,
    serve_fixture,
    serve_fixture_async,
)
from ._http import DRAIN_PATH, LEASE_PATH_PREFIX, RETURN_PATH, STOP_CLAIMING_PATH
from ._wire import DrainStatus, Leadership, LeadershipAck, ReturnRequest, ReturnResult, encode

__all__ = [
    "FakeClock",
    "Client",
    "CallError",
    "FixtureHooks",
    "AsyncFixtureHooks",
    "serve_fixture",
    "serve_fixture_async",
    "run_fixture",
    "fixture_main",
    "FIXTURE_SOCKET_ENV",
    "FIXTURE_PREFIX",
]


class _FakeTimer:
    def __init__(self, clock: "FakeClock", key: int) -> None:
        self._clock = clock
        self._key = key

    def cancel(self) -> bool:
        with self._clock._lock:
            return self._clock._pending.pop(self._key, None) is not None


class FakeClock:
    """A clock that moves only when told (:meth:`step`); timers run in :meth:`step`'s thread.

    ``monotonic`` and ``time`` start at the values given (seconds) and move together.
    """

    def __init__(self, monotonic: float = 1000.0, wall: Optional[float] = None) -> None:
        self._lock = threading.Lock()
        self._mono = monotonic
        self._wall = time.time() if wall is None else wall
        self._heap: List[Tuple[float, int]] = []
        self._pending: Dict[int, Callable[[], None]] = {}
        self._seq = itertools.count()

    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def time(self) -> float:
        with self._lock:
            return self._wall

    def call_later(self, delay: float, fn: Callable[[], None]) -> _FakeTimer:
        with self._lock:
            key = next(self._seq)
            self._pending[key] = fn
            heapq.heappush(self._heap, (self._mono + max(delay, 0.0), key))
            return _FakeTimer(self, key)

    def timers(self) -> int:
        """How many timers are pending."""
        with self._lock:
            return len(self._pending)

    def step(self, seconds: float) -> None:
        """Move both clocks on by ``seconds``, then run every timer due, in order."""
        with self._lock:
            self._mono += seconds
            self._wall += seconds
        while True:
            with self._lock:
                fn = None
                while self._heap and self._heap[0][0] <= self._mono:
                    _, key = heapq.heappop(self._heap)
                    fn = self._pending.pop(key, None)
                    if fn is not None:
                        break
            if fn is None:
                return
            fn()


class CallError(Exception):
    """A call answered with another status than 200: ``status`` and the ``error`` of the body."""

    def __init__(self, status: int, error: str) -> None:
        super().__init__("%d %s" % (status, error))
        self.status = status
        self.error = error


class _Conn(http.client.HTTPConnection):
    def __init__(self, url: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._e = parse_endpoint(url)

    def connect(self) -> None:
        self.sock = dial(self._e, self.timeout)
        if self._e.network == "tcp":
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class Client:
    """Calls the app API at ``url`` as the sidecar does, each call signed with ``token`` (unless ``token`` is None)."""

    def __init__(self, url: str, token: Optional[str], timeout: float = 10.0) -> None:
        self.url = url
        self.token = token
        self.timeout = timeout

    def call(self, method: str, target: str, body: bytes = b"", headers: Optional[Dict[str, str]] = None) -> Tuple[int, Dict[str, str], bytes]:
        """One call on a fresh connection: (status, headers with lowercase names, body)."""
        h: Dict[str, str] = {}
        if body:
            h["Content-Type"] = "application/json"
        if self.token is not None:
            h.update(sign(self.token, method, target, body))
        h.update(headers or {})
        conn = _Conn(self.url, self.timeout)
        try:
            conn.request(method, target, body=body if body else None, headers=h)
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
        finally:
            conn.close()

    def _ok(self, method: str, target: str, body: bytes = b"") -> Dict[str, object]:
        status, _, data = self.call(method, target, body)
        obj = json.loads(data)
        if status != 200:
            raise CallError(status, str(obj.get("error", "")))
        assert isinstance(obj, dict)
        return obj

    def stop_claiming(self) -> DrainStatus:
        return DrainStatus.from_json(self._ok("POST", STOP_CLAIMING_PATH, b"{}"))

    def drain(self, wait_millis: int = 0) -> DrainStatus:
        return DrainStatus.from_json(self._ok("GET", "%s?waitMillis=%d" % (DRAIN_PATH, wait_millis)))

    def return_(self, cancel: bool = False, cancel_wait_millis: int = 0) -> ReturnResult:
        return ReturnResult.from_json(self._ok("POST", RETURN_PATH, encode(ReturnRequest(cancel, cancel_wait_millis))))

    def lead(self, msg: Leadership) -> LeadershipAck:
        return LeadershipAck.from_json(self._ok("PUT", LEASE_PATH_PREFIX + msg.lease, encode(msg)))


if __name__ == "__main__":
    sys.exit(fixture_main())
