"""Claims, waits, stop-claiming, the hand-back of unstarted claims and the return fallback (Go: worker's agent_test, receive_test, unstarted_test, handback_test)."""

from __future__ import annotations

import threading
import time
from typing import List

import pytest

import handoff
from handoff.testing import FakeClock


def agent(**kw: object) -> handoff.Agent:
    return handoff.Agent(insecure_no_token=True, **kw)  # type: ignore[arg-type]


def test_receive_is_not_in_flight_and_ends_at_stop_claiming() -> None:
    a = agent()
    r = a.receive()
    assert (a.in_flight, a.receiving) == (0, 1)
    st = a.drain_status()
    assert not st.drained and not st.stopping and st.receiving == 1
    assert not r.ended.is_set()
    first = a.stop_claiming()
    assert first.stopping and first.receiving == 1, "the answer is the status when claiming stopped"
    assert r.ended.is_set() and isinstance(r.cause, handoff.Stopping)
    assert a.stopping.is_set()
    with pytest.raises(handoff.Stopping):
        a.receive()
    with pytest.raises(handoff.Stopping):
        a.begin()
    r.end()
    r.end()  # idempotent
    assert a.drain_status().drained
    assert a.wait_drained(0)


def test_end_sets_ended_without_cause() -> None:
    a = agent()
    with a.receive() as r:
        pass
    assert r.ended.is_set() and r.cause is None
    assert a.receiving == 0


def test_message_received_in_the_race_with_stop_claiming_is_held() -> None:
    a = agent()
    r = a.receive()
    a.stop_claiming()
    c = r.hold()  # never refuses
    r.end()
    st = a.drain_status()
    assert (st.in_flight, st.receiving, st.drained) == (1, 0, False)
    c.done()
    c.done()
    assert a.drain_status().drained


def test_stop_claiming_only_shrinks_claims_and_is_idempotent() -> None:
    a = agent()
    with a.receive() as r:
        c1, c2 = r.hold(), r.hold()
    assert a.stop_claiming().in_flight == 2
    c1.done()
    again = a.stop_claiming()
    assert again.stopping and again.in_flight == 1 and again.instance == a.instance
    c2.done()


def test_instance_is_random_per_agent() -> None:
    a, b = agent(), agent()
    assert a.instance != b.instance and len(a.instance) == 16
    int(a.instance, 16)


def test_begin_holds_one_claim_at_once() -> None:
    a = agent()
    with a.begin() as c:
        assert a.in_flight == 1 and a.receiving == 0
        c.start()  # started already: nothing to do
    assert a.in_flight == 0 and c.is_done
    with pytest.raises(handoff.ClaimDone):
        c.start()


def test_running_millis_is_the_age_of_the_oldest_started_claim() -> None:
    clock = FakeClock()
    a = agent(clock=clock)
    with a.receive() as r:
        u = r.hold_unstarted("m1")
        clock.step(5)
        c = r.hold()
    assert a.drain_status().running_millis == 0, "unstarted claims are not in progress"
    clock.step(1.5)
    assert a.drain_status().running_millis == 1500
    u.start()
    clock.step(0.25)
    assert a.drain_status().running_millis == 1750
    c.done()
    assert a.drain_status().running_millis == 250
    u.done()
    assert a.drain_status().running_millis == 0


def test_stop_claiming_hands_back_unstarted_claims_at_once() -> None:
    handed: List[List[object]] = []
    release = threading.Event()

    def hand_back(claims: List[handoff.Claim]) -> None:
        handed.append([c.value for c in claims])
        release.wait(5)

    a = agent(hand_back=hand_back)
    with a.receive() as r:
        started = r.hold_unstarted("s")
        started.start()
        u1, u2 = r.hold_unstarted("u1"), r.hold_unstarted("u2")
    assert (a.in_flight, a.unstarted) == (3, 2)
    t0 = time.monotonic()
    st = a.stop_claiming()
    assert time.monotonic() - t0 < 1, "stop-claiming does not wait for the queue"
    assert (st.in_flight, st.unstarted) == (3, 2)
    with pytest.raises(handoff.HandedBack):
        u1.start()
    u1.done()  # the Agent's to end, not the app's: nothing happens
    assert a.in_flight == 3
    release.set()
    deadline = time.monotonic() + 5
    while a.in_flight != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert (a.in_flight, a.unstarted) == (1, 0)
    assert handed and sorted(handed[0]) == ["u1", "u2"]  # type: ignore[type-var]
    assert u2.is_done
    started.done()
    assert a.drain_status().drained


def test_unstarted_after_stop_claiming_is_handed_back_too() -> None:
    got = threading.Event()
    a = agent(hand_back=lambda claims: got.set())
    r = a.receive()
    a.stop_claiming()
    c = r.hold_unstarted("late")
    r.end()
    assert got.wait(5)
    with pytest.raises(handoff.HandedBack):
        c.start()


def test_without_hand_back_unstarted_claims_stay_held() -> None:
    a = agent()
    with a.receive() as r:
        c = r.hold_unstarted("x")
    a.stop_claiming()
    c.start()  # not taken
    assert (a.in_flight, a.unstarted) == (1, 0)
    c.done()


def test_failed_hand_back_is_ended_by_return() -> None:
    calls = []

    def hand_back(claims: List[handoff.Claim]) -> None:
        raise RuntimeError("queue down")

    def return_claims() -> int:
        calls.append(1)
        return 7

    a = agent(hand_back=hand_back, return_claims=return_claims)
    with a.receive() as r:
        r.hold_unstarted("x")
    a.stop_claiming()
    time.sleep(0.1)
    assert (a.in_flight, a.unstarted) == (1, 1), "stays held until the deadline's return"
    res = a.return_()
    assert res == handoff.ReturnResult(7, "")
    assert a.in_flight == 0 and a.unstarted == 0 and calls == [1]


def test_return_stops_claiming() -> None:
    a = agent(return_claims=lambda: 0)
    r = a.receive()
    a.return_()
    assert a.stopping.is_set() and r.ended.is_set()
    with pytest.raises(handoff.Stopping):
        a.receive()


def test_return_with_cancel_cancels_then_returns() -> None:
    a = agent(return_claims=lambda: 5)
    with a.receive() as r:
        ignoring, stopping = r.hold(), r.hold()

    def work() -> None:
        stopping.canceled.wait()
        stopping.done()

    threading.Thread(target=work).start()
    t0 = time.monotonic()
    res = a.return_(cancel=True, cancel_wait=0.3)
    took = time.monotonic() - t0
    assert res.returned == 5 and res.error == ""
    assert 0.3 <= took < 2, "waited cancel_wait for the work that ignores the cancel"
    assert ignoring.canceled.is_set() and isinstance(ignoring.cause, handoff.Canceled)
    ignoring.done()


def test_cancel_reaches_late_holds() -> None:
    a = agent(return_claims=lambda: 0)
    r = a.receive()
    a.return_(cancel=True, cancel_wait=0)
    c = r.hold()
    assert c.canceled.is_set() and isinstance(c.cause, handoff.Canceled)


def test_return_answers_once_canceled_work_ends() -> None:
    a = agent(return_claims=lambda: 2)
    with a.receive() as r:
        cs = [r.hold(), r.hold()]
    for c in cs:
        threading.Thread(target=lambda c=c: (c.canceled.wait(), c.done())).start()
    t0 = time.monotonic()
    assert a.return_(cancel=True, cancel_wait=3).returned == 2
    assert time.monotonic() - t0 < 1.5


def test_return_claims_error_is_reported_with_its_count() -> None:
    def partial() -> int:
        raise handoff.ReturnClaimsError(2, "1 message could not be made visible")

    assert agent(return_claims=partial).return_() == handoff.ReturnResult(2, "1 message could not be made visible")

    def broken() -> int:
        raise OSError("queue unreachable")

    assert agent(return_claims=broken).return_() == handoff.ReturnResult(0, "queue unreachable")
    assert agent().return_() == handoff.ReturnResult(0, ""), "no return_claims: nothing handed back, no error"


class VisQueue:
    """A queue with a visibility timeout as one worker sees it (Go: handback_test's visQueue)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.visible: List[str] = []
        self.claimed: set = set()  # type: ignore[type-arg]
        self.calls = 0
        self.running = 0
        self.overlap = False
        self.hook = None  # type: ignore[var-annotated]
        #: Runs first in return_claims, before it looks at the queue, with the call's number (1 for the first).
        self.gate = None  # type: ignore[var-annotated]

    def claim(self, mid: str) -> None:
        with self.lock:
            self.claimed.add(mid)

    def return_claims(self) -> int:
        with self.lock:
            self.running += 1
            self.overlap |= self.running > 1
            self.calls += 1
            call = self.calls
        if self.gate:
            self.gate(call)
        with self.lock:
            n = len(self.claimed)
            self.visible += sorted(self.claimed)
            self.claimed.clear()
        if self.hook:
            self.hook()
        with self.lock:
            self.running -= 1
        return n

    def wait_visible(self, *ids: str) -> None:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            with self.lock:
                if all(i in self.visible for i in ids):
                    return
            time.sleep(0.005)
        raise AssertionError("%s not handed back; visible %s, claimed %s" % (ids, self.visible, self.claimed))


def test_claim_ended_after_return_is_handed_back() -> None:
    q = VisQueue()
    a = agent(return_claims=q.return_claims)
    r = a.receive()
    a.return_()  # the deadline's hand-back: nothing claimed yet
    q.claim("late")  # a wait under way claims a message after it
    c = r.hold()
    r.end()
    c.done()  # given up unfinished
    q.wait_visible("late")
    assert q.calls == 2 and not q.overlap


def test_claim_ended_during_the_first_return_is_handed_back() -> None:
    q = VisQueue()
    a = agent(return_claims=q.return_claims)
    with a.receive() as r:
        c = r.hold()
    ended = threading.Event()

    def during() -> None:
        q.hook = None
        q.claim("raced")  # claimed after the call took its view of the queue
        c.done()
        ended.set()

    q.hook = during
    a.return_()
    assert ended.is_set()
    q.wait_visible("raced")
    assert not q.overlap


def test_return_again_calls_never_overlap() -> None:
    q = VisQueue()
    gate = threading.Event()
    q.hook = lambda: gate.wait(0.2)
    a = agent(return_claims=q.return_claims)
    with a.receive() as r:
        cs = [r.hold() for _ in range(5)]
    a.return_()
    for i, c in enumerate(cs):
        q.claim("m%d" % i)
        c.done()
    gate.set()
    q.wait_visible(*("m%d" % i for i in range(5)))
    assert not q.overlap
    assert q.calls <= 1 + 5


def test_wait_drained_waits_for_the_hand_back_after_return() -> None:
    """A worker that exits once wait_drained returns True leaves nothing claimed (Go: TestWaitDrainedWaitsForTheHandBackAfterReturn).

    A wait inside ``begin`` claims its message just after the return
    fallback's hand-back and gives it up; wait_drained is True only once the
    hand-back that follows has returned. Failed so before: True as soon as
    no claim was held, with the message still claimed.
    """
    q = VisQueue()
    entered, resume = threading.Event(), threading.Event()

    def gate(call: int) -> None:
        if call == 2:  # the hand-back after the return fallback's
            entered.set()
            resume.wait(10)

    q.gate = gate
    a = agent(return_claims=q.return_claims)
    try:
        c = a.begin()  # a wait for a message inside begin
        a.stop_claiming()
        assert a.return_() == handoff.ReturnResult(0, ""), "nothing claimed yet"
        q.claim("m")  # lands just after the hand-back
        c.done()  # given up unfinished
        assert entered.wait(5), "return_claims not called again"
        assert a.in_flight == 0
        assert a.wait_drained(0) is False, "drained while the hand-back of m runs: a worker exiting now leaves m claimed"
    finally:
        resume.set()
    assert a.wait_drained(5) is True
    with q.lock:
        assert "m" in q.visible, "wait_drained returned with m still claimed"


def test_wait_drained_gives_up_on_a_hand_back_past_its_bound(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A return_claims call stuck past handoff.CALLBACK_TIMEOUT ends wait_drained with False, even without a timeout."""
    monkeypatch.setattr(handoff._agent, "CALLBACK_TIMEOUT", 0.2)
    q = VisQueue()
    entered, release = threading.Event(), threading.Event()

    def gate(call: int) -> None:
        if call == 2:
            entered.set()
            release.wait(30)  # stuck

    q.gate = gate
    a = agent(return_claims=q.return_claims)
    try:
        c = a.begin()
        a.return_()
        c.done()
        assert entered.wait(5)
        t0 = time.monotonic()
        assert a.wait_drained() is False
        assert time.monotonic() - t0 < 5
        assert "did not return within" in caplog.text
    finally:
        release.set()


def test_wait_drained() -> None:
    a = agent()
    c = a.begin()
    assert not a.wait_drained(0.05)
    threading.Timer(0.1, c.done).start()
    assert a.wait_drained(5)


def test_receive_is_safe_for_concurrent_holds() -> None:
    a = agent()
    r = a.receive()
    claims: List[handoff.Claim] = []
    lock = threading.Lock()

    def deliver() -> None:
        for _ in range(100):
            c = r.hold()
            with lock:
                claims.append(c)

    ts = [threading.Thread(target=deliver) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    r.end()
    assert a.in_flight == 400
    for c in claims:
        c.done()
    assert a.drain_status().drained
