"""handoff.testing's fixture: the worker's half (FixtureHooks) and the fixture command (run_fixture), step by step.

The whole contract is proved by the real ``handoff conformance`` in
test_conformance.py; these check each step's answer, exit status and when
it returns without the binary.
"""

from __future__ import annotations

import io
import os
import shlex
import sys
import threading
import time
from typing import Callable, List, Optional

import pytest

import handoff
import handoff.aio
from handoff._http import RevokeWait
from handoff.protocol import Leadership
from handoff.testing import AsyncFixtureHooks, FakeClock, FixtureHooks, run_fixture, serve_fixture

from test_leadership import grant, put, seq


class ListQueue:
    def __init__(self) -> None:
        self.items: List[str] = []
        self.cond = threading.Condition()

    def put(self, body: str) -> None:
        with self.cond:
            self.items.append(body)
            self.cond.notify_all()

    def take(self, timeout: float) -> Optional[str]:
        with self.cond:
            self.cond.wait_for(lambda: self.items, timeout)
            return self.items.pop(0) if self.items else None


def claim_loop(agent: handoff.Agent, q: ListQueue, fx: FixtureHooks, canceled: List[str]) -> None:
    while True:
        try:
            r = agent.receive()
        except handoff.Stopping:
            return
        with r:
            body = q.take(0.05)
            if body is None:
                continue
            claim = r.hold()
        with claim:
            try:
                fx.work(body, claim)
            except handoff.Canceled:
                canceled.append(body)


def eventually(cond: Callable[[], bool], timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(0.005)
    return True


def worker(deliver: bool = True) -> "tuple[handoff.Agent, FixtureHooks, List[str]]":
    agent = handoff.Agent(insecure_no_token=True)
    q = ListQueue()
    fx = FixtureHooks(agent, publish=q.put, deliver=(lambda body: body) if deliver else None)
    canceled: List[str] = []
    for _ in range(3):
        threading.Thread(target=claim_loop, args=(agent, q, fx, canceled), daemon=True).start()
    return agent, fx, canceled


def test_hold_answers_once_the_work_runs_and_finish_ends_it() -> None:
    agent, fx, _ = worker()
    assert fx.step(["hold", "2"]) == "ok"
    assert agent.in_flight == 2 and agent.unstarted == 0  # counted at the answer, not later
    assert fx.step(["hold", "1"]) == "ok"
    assert agent.in_flight == 3
    assert fx.step(["finish"]) == "ok"
    assert eventually(lambda: agent.in_flight == 0), agent.in_flight
    # Work held after a finish waits for the next one.
    assert fx.step(["hold", "1"]) == "ok"
    assert agent.in_flight == 1
    assert fx.step(["finish"]) == "ok"
    assert eventually(lambda: agent.in_flight == 0)


def test_hold_cancelable_ends_at_the_cancel_fallback_not_at_finish() -> None:
    agent, fx, canceled = worker()
    assert fx.step(["hold-cancelable", "2"]) == "ok"
    assert agent.in_flight == 2
    assert fx.step(["hold", "1"]) == "ok"
    assert fx.step(["finish"]) == "ok"
    assert eventually(lambda: agent.in_flight == 2)  # the held one ended; the cancelable ones wait for the cancel
    assert canceled == []
    agent.return_(cancel=True, cancel_wait=3)
    assert eventually(lambda: len(canceled) == 2 and agent.in_flight == 0), (canceled, agent.in_flight)
    assert all(b.startswith("conformance-cancelable-") for b in canceled)


def test_hold_unstarted_and_finish_drops_those_not_handed_back() -> None:
    agent, fx, _ = worker()
    assert fx.step(["hold-unstarted", "3"]) == "ok"
    assert agent.in_flight == 3 and agent.unstarted == 3
    assert fx.step(["finish"]) == "ok"
    assert agent.in_flight == 0 and agent.unstarted == 0


def test_hold_unstarted_without_deliver_is_unsupported() -> None:
    _, fx, _ = worker(deliver=False)
    assert fx.step(["hold-unstarted", "1"]) == "unsupported"


@pytest.mark.parametrize(
    "words, want",
    [
        (["hold"], "error: N must be an integer >= 1, got ''"),
        (["hold", "x"], "error: N must be an integer >= 1, got 'x'"),
        (["hold-cancelable", "0"], "error: N must be an integer >= 1, got 0"),
        (["lead"], "error: lead needs a Lease name"),
        (["restart"], "error: restart is the fixture command's step (run_fixture), not the worker's"),
        (["frobnicate", "1"], "error: unknown step 'frobnicate 1'"),
        (["ping"], "ok"),
    ],
)
def test_bad_steps_answer_an_error(words: List[str], want: str) -> None:
    _, fx, _ = worker()
    assert fx.step(words) == want


def test_lead_stopping_release() -> None:
    clock = FakeClock(monotonic=500.0, wall=1767225600.0)
    agent = handoff.Agent(insecure_no_token=True, clock=clock)
    fx = FixtureHooks(agent, publish=lambda b: None)
    assert fx.step(["lead", "orders"]) == "no"  # not the leader
    assert fx.step(["stopping", "orders"]) == "no"  # no leader work began
    assert grant(agent, clock, "orders", seq(clock), 2000)[0] == 200
    assert fx.step(["lead", "orders"]) == "yes"
    assert fx.step(["lead", "orders"]) == "yes"
    assert fx.step(["stopping", "orders"]) == "no"
    clock.step(3.0)  # the term ends on the app's clock
    assert fx.step(["stopping", "orders"]) == "yes"
    assert fx.step(["release", "orders"]) == "ok"
    assert fx.step(["stopping", "orders"]) == "no"  # released work is forgotten
    assert fx.step(["release", "orders"]) == "ok"  # nothing begun: nothing to do


def test_release_lets_the_revoke_be_acknowledged() -> None:
    clock = FakeClock(monotonic=500.0, wall=1767225600.0)
    agent = handoff.Agent(insecure_no_token=True, clock=clock)
    fx = FixtureHooks(agent, publish=lambda b: None)
    s = seq(clock)
    assert grant(agent, clock, "orders", s, 15000)[0] == 200
    assert fx.step(["lead", "orders"]) == "yes"
    act = put(agent, "orders", Leadership("orders", False, s + 1))
    assert isinstance(act, RevokeWait)
    assert fx.step(["stopping", "orders"]) == "yes"
    acked = threading.Event()
    threading.Thread(target=lambda: agent._wait_leader_work("orders", act.terms, lambda: False) and acked.set(), daemon=True).start()
    assert not acked.wait(0.3), "acked with the leader work still running"
    assert fx.step(["release", "orders"]) == "ok"
    assert acked.wait(5), "the revoke was not acknowledged after release"


def test_serve_fixture_only_under_the_fixture(monkeypatch: pytest.MonkeyPatch, sockdir: str) -> None:
    agent = handoff.Agent(insecure_no_token=True)
    monkeypatch.delenv("HANDOFF_FIXTURE_SOCKET", raising=False)
    assert serve_fixture(agent, publish=lambda b: None) is None
    monkeypatch.setenv("HANDOFF_FIXTURE_SOCKET", os.path.join(sockdir, "fixture.sock"))
    fx = serve_fixture(agent, publish=lambda b: None)
    assert fx is not None
    try:
        out, err = io.StringIO(), io.StringIO()
        assert run_fixture(sockdir, "unused", ["stopping", "orders"], out=out, err=err) == 0
        assert out.getvalue() == "no\n" and err.getvalue() == ""
        out = io.StringIO()
        assert run_fixture(sockdir, "unused", ["release", "orders"], out=out, err=err) == 0
        assert out.getvalue() == ""  # ok prints nothing
        assert run_fixture(sockdir, "unused", ["hold-unstarted", "1"], out=out, err=err) == 0
        assert out.getvalue() == "unsupported\n"
        out = io.StringIO()
        assert run_fixture(sockdir, "unused", ["hold", "x"], out=out, err=err) == 1
        assert out.getvalue() == "" and "hold x: N must be an integer" in err.getvalue()
    finally:
        fx.close()
    assert not os.path.exists(os.path.join(sockdir, "fixture.sock"))
    err = io.StringIO()
    assert run_fixture(sockdir, "unused", ["finish"], err=err) == 1  # nothing serves: a failed step
    assert "finish" in err.getvalue()


WORKER = """
import os, sys, threading, handoff, handoff.testing
a = handoff.Agent(insecure_no_token=True)
a.start("unix://" + sys.argv[1])
handoff.testing.serve_fixture(a, publish=lambda b: None)
print("instance", a.instance, flush=True)
threading.Event().wait()
"""


def test_restart_starts_a_fresh_process_and_stop_stops_it(sockdir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    monkeypatch.setenv("PYTHONPATH", src)
    script = os.path.join(sockdir, "w.py")
    with open(script, "w") as f:
        f.write(WORKER)
    cmd = " ".join(shlex.quote(w) for w in (sys.executable, script, os.path.join(sockdir, "app.sock")))
    pids = []
    for _ in range(2):
        err = io.StringIO()
        assert run_fixture(sockdir, cmd, ["restart"], err=err) == 0, err.getvalue()
        with open(os.path.join(sockdir, "worker.pid")) as f:
            pids.append(int(f.read()))
        assert os.path.exists(os.path.join(sockdir, "app.sock"))  # the app serves before the fixture answers
    assert pids[0] != pids[1]
    assert not os.path.exists("/proc/%d" % pids[0]) or open("/proc/%d/stat" % pids[0]).read().rsplit(")", 1)[1].split()[0] == "Z"
    assert run_fixture(sockdir, cmd, ["stop"]) == 0
    assert not os.path.exists(os.path.join(sockdir, "worker.pid"))
    err = io.StringIO()
    assert run_fixture(sockdir, "sh -c 'exit 3'", ["restart"], err=err) == 1
    assert "exited with status 3" in err.getvalue()


def test_async_hooks_hold_and_finish() -> None:
    import asyncio

    async def main() -> None:
        agent = handoff.aio.Agent(insecure_no_token=True)
        q: "asyncio.Queue[str]" = asyncio.Queue()
        fx = AsyncFixtureHooks(agent, publish=q.put_nowait, deliver=lambda b: b)

        async def loop() -> None:
            while True:
                body = await q.get()
                async with agent.receive() as r:
                    claim = r.hold()
                async with claim:
                    await fx.work(body, claim)

        task = asyncio.ensure_future(loop())
        tasks = [asyncio.ensure_future(loop()) for _ in range(2)] + [task]
        assert await fx.step(["hold", "2"]) == "ok"
        assert agent.in_flight == 2
        assert await fx.step(["hold-unstarted", "1"]) == "ok"
        assert agent.in_flight == 3 and agent.unstarted == 1
        assert await fx.step(["finish"]) == "ok"
        for _ in range(500):
            if agent.in_flight == 0:
                break
            await asyncio.sleep(0.005)
        assert agent.in_flight == 0
        assert await fx.step(["lead", "x"]) == "no"
        assert await fx.step(["hold", "0"]) == "error: N must be an integer >= 1, got 0"
        for t in tasks:
            t.cancel()

    asyncio.run(main())


def test_hooks_check_the_agent() -> None:
    with pytest.raises(TypeError, match="AsyncFixtureHooks"):
        FixtureHooks(handoff.aio.Agent(insecure_no_token=True), publish=lambda b: None)  # type: ignore[arg-type]
