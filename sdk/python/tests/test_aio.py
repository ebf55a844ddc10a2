"""handoff.aio: the asyncio twin keeps the threaded Agent's semantics."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from typing import Any, Awaitable, Callable, List, TypeVar

import pytest

import handoff
import handoff.aio
from conftest import TOKEN
from handoff.protocol import Leadership, LeadershipAck
from handoff.testing import Client, FakeClock

T = TypeVar("T")


def run(f: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(asyncio.wait_for(f(), 30))  # type: ignore[arg-type]


def test_async_event_is_set_from_any_thread() -> None:
    async def main() -> None:
        ev = handoff.aio.AsyncEvent()
        waiters = [asyncio.ensure_future(ev.wait()) for _ in range(3)]
        await asyncio.sleep(0.01)
        assert not any(w.done() for w in waiters)
        threading.Timer(0.05, ev.set).start()
        assert await asyncio.gather(*waiters) == [True] * 3
        assert ev.is_set() and await ev.wait()
        other = handoff.aio.AsyncEvent()
        w = asyncio.ensure_future(other.wait())
        await asyncio.sleep(0.01)
        w.cancel()
        with pytest.raises(asyncio.CancelledError):
            await w
        assert other._waiters == [], "a canceled wait is forgotten"
        other.set()

    run(main)


def test_receive_hold_and_stop_claiming() -> None:
    async def main() -> None:
        a = handoff.aio.Agent(insecure_no_token=True)
        async with a.receive() as r:
            assert not await r.wait(0.01)
            c = r.hold()
        r2 = a.receive()
        assert a.drain_status().receiving == 1
        st = a.stop_claiming()
        assert st.stopping and st.in_flight == 1 and st.receiving == 1
        assert await r2.wait(1) and isinstance(r2.cause, handoff.Stopping)
        assert await asyncio.wait_for(a.stopping.wait(), 1)
        with pytest.raises(handoff.Stopping):
            a.receive()
        r2.end()
        assert not await a.wait_drained(0.05)
        async with c:
            pass
        assert await a.wait_drained(1)

    run(main)


def test_hand_back_at_stop_claiming_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handoff.aio, "CALLBACK_TIMEOUT", 0.2)

    async def main() -> None:
        got: List[object] = []

        async def hand_back(claims: List[handoff.aio.Claim]) -> None:
            got.extend(c.value for c in claims)

        a = handoff.aio.Agent(insecure_no_token=True, hand_back=hand_back)
        async with a.receive() as r:
            u = r.hold_unstarted("u")
            s = r.hold_unstarted("s")
        s.start()
        a.stop_claiming()
        with pytest.raises(handoff.HandedBack):
            u.start()
        for _ in range(100):
            if a.in_flight == 1:
                break
            await asyncio.sleep(0.01)
        assert got == ["u"] and (a.in_flight, a.unstarted) == (1, 0)
        s.done()

        async def stuck(claims: List[handoff.aio.Claim]) -> None:
            await asyncio.sleep(60)

        b = handoff.aio.Agent(insecure_no_token=True, hand_back=stuck, return_claims=lambda: asyncio.sleep(0, 1))
        async with b.receive() as r:
            r.hold_unstarted("x")
        b.stop_claiming()
        await asyncio.sleep(0.4)
        assert (b.in_flight, b.unstarted) == (1, 1), "a hand-back past its bound leaves the claim to the deadline"
        assert (await b.return_()).returned == 1
        assert b.in_flight == 0

    run(main)


def test_return_with_cancel_and_again_after_the_deadline() -> None:
    async def main() -> None:
        calls: List[int] = []
        claimed = {"n": 0}

        async def return_claims() -> int:
            calls.append(claimed["n"])
            n, claimed["n"] = claimed["n"], 0
            return n

        a = handoff.aio.Agent(insecure_no_token=True, return_claims=return_claims)
        r = a.receive()
        c1, c2 = r.hold(), r.hold()
        claimed["n"] = 2

        async def work(c: handoff.aio.Claim) -> None:
            await c.canceled.wait()
            assert isinstance(c.cause, handoff.Canceled)
            c.done()

        asyncio.ensure_future(work(c1))
        t0 = time.monotonic()
        res = await a.return_(cancel=True, cancel_wait=0.3)
        assert res == handoff.ReturnResult(2) and 0.3 <= time.monotonic() - t0 < 2
        assert r.ended.is_set()
        late = r.hold()  # a wait under way claims one more after the hand-back
        assert late.canceled.is_set()
        r.end()
        claimed["n"] = 1
        late.done()
        for _ in range(100):
            if len(calls) >= 2:
                break
            await asyncio.sleep(0.01)
        assert calls == [2, 1]
        c2.done()
        await asyncio.sleep(0.05)
        assert calls == [2, 1, 0]

    run(main)


def test_wait_drained_waits_for_the_hand_back_after_return() -> None:
    """The asyncio twin of test_claims' test: wait_drained is True only once the hand-back after the return fallback has returned."""

    async def main() -> None:
        visible: List[str] = []
        claimed: List[str] = []
        calls = {"n": 0}
        entered, resume = asyncio.Event(), asyncio.Event()

        async def return_claims() -> int:
            calls["n"] += 1
            if calls["n"] == 2:  # the hand-back after the return fallback's
                entered.set()
                await resume.wait()
            n = len(claimed)
            visible.extend(claimed)
            claimed.clear()
            return n

        a = handoff.aio.Agent(insecure_no_token=True, return_claims=return_claims)
        c = a.begin()  # a wait for a message inside begin
        a.stop_claiming()
        assert await a.return_() == handoff.ReturnResult(0)
        claimed.append("m")  # lands just after the hand-back
        c.done()  # given up unfinished
        await asyncio.wait_for(entered.wait(), 5)
        assert a.in_flight == 0
        assert await a.wait_drained(0) is False, "drained while the hand-back of m runs: a worker exiting now leaves m claimed"
        resume.set()
        assert await a.wait_drained(5) is True
        assert visible == ["m"], "wait_drained returned with m still claimed"

    run(main)


def test_wait_drained_gives_up_on_a_hand_back_past_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sidecar's return call is not canceled by the Agent: wait_drained waits for it at most CALLBACK_TIMEOUT, then says False."""
    monkeypatch.setattr(handoff.aio, "CALLBACK_TIMEOUT", 0.2)

    async def main() -> None:
        entered, release = asyncio.Event(), asyncio.Event()

        async def stuck() -> int:
            entered.set()
            await release.wait()
            return 0

        a = handoff.aio.Agent(insecure_no_token=True, return_claims=stuck)
        c = a.begin()
        ret = asyncio.ensure_future(a.return_())
        await asyncio.wait_for(entered.wait(), 5)
        c.done()
        t0 = time.monotonic()
        assert await a.wait_drained() is False
        assert time.monotonic() - t0 < 5
        release.set()
        await ret

    run(main)


def test_leadership_on_a_fake_clock() -> None:
    async def main() -> None:
        clock = FakeClock(wall=1767225600.0)
        a = handoff.aio.Agent(insecure_no_token=True, clock=clock)
        from handoff._http import Head, dispatch
        from handoff._wire import encode

        msg = Leadership("orders", True, int(clock.time() * 1e9), "", 5, None, 1000)
        dispatch(a, None, Head("PUT", "/handoff/v1/leases/orders", "HTTP/1.1", {}, True), encode(msg))
        async with a.begin_leading("orders") as work:
            assert work.fencing_token == 5
            assert not await work.wait(0.01)
            clock.step(1.0)
            assert await work.wait(1)
        with pytest.raises(handoff.NotLeader):
            a.begin_leading("orders")

    run(main)


def test_server_over_a_unix_socket(sockdir: str) -> None:
    async def main() -> None:
        a = handoff.aio.Agent(token=TOKEN, return_claims=lambda: asyncio.sleep(0, 3))
        async with a:
            pass  # no $HANDOFF_APP_URL: see below
        raise AssertionError("unreachable")

    with pytest.raises(handoff.EndpointError, match="HANDOFF_APP_URL"):
        run(main)

    async def serve() -> None:
        a = handoff.aio.Agent(token=TOKEN, return_claims=lambda: asyncio.sleep(0, 3))
        await a.start("unix://%s/app.sock" % sockdir)
        path = os.path.join(sockdir, "app.sock")
        assert os.stat(path).st_mode & 0o777 == 0o666
        c = Client(a.url, TOKEN)
        claim = a.begin()
        t0 = time.monotonic()
        st = await asyncio.to_thread(c.drain, 300)
        assert not st.drained and 0.29 <= time.monotonic() - t0 < 2
        loop = asyncio.get_running_loop()
        loop.call_later(0.2, claim.done)
        st = await asyncio.to_thread(c.drain, 20000)
        assert st.drained and st.instance == a.instance
        # unsigned: 401
        status, headers, body = await asyncio.to_thread(Client(a.url, None).call, "POST", "/handoff/v1/stop-claiming", b"{}")
        assert status == 401 and "HANDOFF-HMAC-SHA256" in headers["www-authenticate"]
        assert not a.stopping.is_set()
        # revoke waits for leader work
        await asyncio.to_thread(c.lead, Leadership("orders", True, time.time_ns(), "", 1, None, 5000))
        work = a.begin_leading("orders")
        fut = asyncio.ensure_future(asyncio.to_thread(c.lead, Leadership("orders", False, time.time_ns())))
        assert await work.wait(5)
        await asyncio.sleep(0.3)
        assert not fut.done(), "revoke acked while leader work runs"
        work.done()
        assert await fut == LeadershipAck(False)
        # return
        assert await asyncio.to_thread(c.return_) == handoff.ReturnResult(3)
        await a.close()
        assert not os.path.exists(path)

    run(serve)


def test_413_and_one_write_per_answer(monkeypatch: pytest.MonkeyPatch, sockdir: str) -> None:
    writes: List[int] = []
    orig = asyncio.StreamWriter.write

    def write(self: asyncio.StreamWriter, data: Any) -> None:
        writes.append(len(data))
        orig(self, data)

    monkeypatch.setattr(asyncio.StreamWriter, "write", write)

    async def main() -> None:
        a = await handoff.aio.Agent(token=TOKEN).start("unix://%s/app.sock" % sockdir)
        c = Client(a.url, TOKEN)
        await asyncio.to_thread(c.drain)
        await asyncio.to_thread(c.call, "GET", "/nowhere")
        await asyncio.to_thread(c.stop_claiming)
        assert len(writes) == 3

        def big() -> "tuple[int, bytes]":
            from handoff.protocol import sign

            body = b'{"pad": "' + b"x" * (64 << 10) + b'"}'
            h = sign(TOKEN, "POST", "/handoff/v1/return", body)
            s = socket.socket(socket.AF_UNIX)
            s.connect(os.path.join(sockdir, "app.sock"))
            s.sendall(b"POST /handoff/v1/return HTTP/1.1\r\nContent-Length: %d\r\n" % len(body)
                      + "".join("%s: %s\r\n" % kv for kv in h.items()).encode() + b"\r\n" + body)
            out = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                out += chunk
            s.close()
            return int(out.split()[1]), out

        status, out = await asyncio.to_thread(big)
        assert status == 413 and b"Connection: close" in out and b"65536" in out
        await a.close()

    run(main)


def test_tcp_loopback() -> None:
    async def main() -> None:
        a = await handoff.aio.Agent(token=TOKEN).start("http://127.0.0.1:0")
        assert a.url.startswith("http://127.0.0.1:")
        st = await asyncio.to_thread(Client(a.url, TOKEN).stop_claiming)
        assert st.stopping
        await a.close()

    run(main)


def test_agent_made_outside_a_loop_works_inside_one() -> None:
    got: List[int] = []

    async def hand_back(claims: List[handoff.aio.Claim]) -> None:
        got.append(len(claims))

    a = handoff.aio.Agent(insecure_no_token=True, hand_back=hand_back)

    async def main() -> None:
        with a.receive() as r:
            r.hold_unstarted(1)
        a.stop_claiming()
        await asyncio.sleep(0.05)
        assert got == [1] and a.in_flight == 0

    run(main)




def test_expect_100_continue(sockdir: str) -> None:
    from test_server import expect_continue

    async def main() -> None:
        a = await handoff.aio.Agent(token=TOKEN, return_claims=lambda: asyncio.sleep(0, 1)).start("unix://%s/app.sock" % sockdir)
        interim, status, out = await asyncio.to_thread(expect_continue, os.path.join(sockdir, "app.sock"))
        assert interim.startswith(b"HTTP/1.1 100") and status == 200 and out == b'{"returned":1}\n'
        await a.close()

    run(main)
