"""Leadership: terms on the app's own clock, sequences, 422s and the revoke's ack (Go: worker's agent_test, leader tests)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Optional

import pytest

import handoff
from handoff._http import Head, Response, RevokeWait, dispatch
from handoff._wire import encode
from handoff.protocol import Leadership, format_rfc3339
from handoff.testing import FakeClock

WALL = 1767225600.0


def setup(**kw: Any) -> "tuple[handoff.Agent, FakeClock]":
    clock = FakeClock(monotonic=500.0, wall=WALL)
    return handoff.Agent(insecure_no_token=True, clock=clock, **kw), clock


def put(a: handoff.Agent, lease: str, body: Any, path_lease: Optional[str] = None) -> Any:
    if isinstance(body, Leadership):
        raw = encode(body)
    elif isinstance(body, dict):
        raw = json.dumps(body).encode()
    else:
        raw = body
    return dispatch(a, None, Head("PUT", "/handoff/v1/leases/" + (path_lease or lease), "HTTP/1.1", {}, True), raw)


def answer(act: Any) -> "tuple[int, Any]":
    assert isinstance(act, Response), act
    return act.status, json.loads(act.body)


def seq(clock: FakeClock, extra: int = 0) -> int:
    return int(clock.time() * 1e9) + extra


def grant(a: handoff.Agent, clock: FakeClock, lease: str, s: int, valid_ms: int, until_s: Optional[float] = None, token: int = 1) -> Any:
    msg = Leadership(lease, True, s, "pod_uid", token, None if until_s is None else int((clock.time() + until_s) * 1e9), valid_ms)
    return answer(put(a, lease, msg))


def revoke(a: handoff.Agent, lease: str, s: int) -> Any:
    return put(a, lease, Leadership(lease, False, s))


def test_term_ends_at_valid_for_millis_on_the_apps_clock() -> None:
    a, clock = setup()
    assert grant(a, clock, "orders", seq(clock), 2000, until_s=10) == (200, {"leader": True})
    term = a.leader("orders")
    assert term is not None and term.fencing_token == 1 and term.until == pytest.approx(502.0)
    work = a.begin_leading("orders")
    changed = a.leadership_changed()
    clock.step(1.999)
    assert a.leader("orders") is not None and not work.stopping.is_set()
    clock.step(0.002)
    assert a.leader("orders") is None
    assert work.stopping.is_set() and changed.is_set()
    with pytest.raises(handoff.NotLeader):
        a.begin_leading("orders")
    work.done()


def test_term_ends_at_until_when_earlier() -> None:
    a, clock = setup()
    grant(a, clock, "orders", seq(clock), 9000, until_s=0.4)
    term = a.leader("orders")
    assert term is not None and term.until == pytest.approx(500.4)
    with a.begin_leading("orders") as work:
        clock.step(0.41)
        assert work.stopping.is_set()


def test_grant_without_valid_for_is_over_on_arrival() -> None:
    a, clock = setup()
    assert grant(a, clock, "orders", seq(clock), 0, until_s=10) == (200, {"leader": True})
    assert a.leader("orders") is None


def test_renewal_extends_the_term_and_is_no_change() -> None:
    a, clock = setup()
    grant(a, clock, "orders", seq(clock), 2000)
    work = a.begin_leading("orders")
    changed = a.leadership_changed()
    clock.step(1.5)
    grant(a, clock, "orders", seq(clock), 2000)
    clock.step(1.0)  # past the first grant's end
    assert not work.stopping.is_set() and a.leader("orders") is not None
    assert not changed.is_set(), "a renewal is not a change of leadership"
    clock.step(1.01)
    assert work.stopping.is_set()
    work.done()


def test_new_fencing_token_ends_the_old_term() -> None:
    a, clock = setup()
    grant(a, clock, "orders", seq(clock), 5000, token=3)
    old = a.begin_leading("orders")
    changed = a.leadership_changed()
    grant(a, clock, "orders", seq(clock, 1), 5000, token=4)
    assert old.stopping.is_set() and changed.is_set()
    new = a.begin_leading("orders")
    assert new.fencing_token == 4 and not new.stopping.is_set()
    old.done()
    new.done()


def test_sequence_orders_messages() -> None:
    a, clock = setup()
    s1 = seq(clock)
    grant(a, clock, "orders", s1, 5000)
    assert grant(a, clock, "orders", s1, 5000) == (200, {"leader": True, "stale": True})
    assert grant(a, clock, "orders", s1 - 500, 5000) == (200, {"leader": True, "stale": True})
    assert answer(revoke(a, "orders", s1 - 100)) == (200, {"leader": False, "stale": True})
    assert a.leader("orders") is not None, "a stale revoke ends nothing"
    s3 = seq(clock, 10_000)
    act = revoke(a, "orders", s3)
    assert isinstance(act, RevokeWait) and len(act.terms) == 1
    assert a.leader("orders") is None
    assert grant(a, clock, "orders", s3 - 1, 5000) == (200, {"leader": True, "stale": True})
    assert a.leader("orders") is None, "a grant older than the revoke, delivered after it, does not overtake it"
    with pytest.raises(handoff.NotLeader):
        a.begin_leading("orders")


def test_first_message_applied_whatever_its_number() -> None:
    a, clock = setup()
    assert grant(a, clock, "orders", 1, 5000) == (200, {"leader": True})
    assert a.leader("orders") is not None
    assert grant(a, clock, "other", -5, 5000) == (200, {"leader": True})


def test_messages_that_cannot_be_genuine_are_refused_422_and_not_recorded() -> None:
    a, clock = setup(lease_duration=15.0)
    ahead = seq(clock, 1_000_000_001)
    assert grant(a, clock, "orders", ahead, 5000)[0] == 422
    assert answer(revoke(a, "orders", ahead))[0] == 422
    assert grant(a, clock, "orders", seq(clock), 15001)[0] == 422
    assert grant(a, clock, "orders", seq(clock), 5000, until_s=15.5)[0] == 422
    assert grant(a, clock, "orders", seq(clock, 999_999_999), 15000, until_s=15)[0] == 200
    # The refused sequences were not recorded: a message below them still applies.
    b, clock = setup(lease_duration=15.0)
    grant(b, clock, "orders", seq(clock, 1_000_000_001), 5000)
    assert grant(b, clock, "orders", seq(clock), 5000) == (200, {"leader": True})


def test_lease_duration_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HANDOFF_LEASE_DURATION", "15s")
    a, clock = setup()
    assert grant(a, clock, "orders", seq(clock), 15001)[0] == 422
    monkeypatch.setenv("HANDOFF_LEASE_DURATION", "1m30s")
    a, clock = setup()
    assert grant(a, clock, "orders", seq(clock), 90000)[0] == 200
    monkeypatch.delenv("HANDOFF_LEASE_DURATION")
    a, clock = setup()
    assert grant(a, clock, "orders", seq(clock), 3600001)[0] == 422, "1h without the variable"
    for bad in ("2h", "0s", "-5s", "15", "soon"):
        monkeypatch.setenv("HANDOFF_LEASE_DURATION", bad)
        with pytest.raises(handoff.ConfigError, match="HANDOFF_LEASE_DURATION"):
            setup()


def test_lease_in_the_body_must_be_the_paths() -> None:
    a, clock = setup()
    st, body = answer(put(a, "orders", Leadership("other", True, seq(clock), "", 1, None, 5000), path_lease="orders"))
    assert st == 400 and "differs" in body["error"]
    assert a.leader("orders") is None and a.leader("other") is None
    # An empty lease is read as the path's.
    assert answer(put(a, "orders", {"leader": True, "sequence": seq(clock), "validForMillis": 5000})) == (200, {"leader": True})
    assert a.leader("orders") is not None


def test_revoke_of_an_unknown_lease_is_acked_at_once() -> None:
    a, clock = setup()
    act = revoke(a, "never", seq(clock))
    assert isinstance(act, RevokeWait) and act.terms == []
    assert a._wait_leader_work("never", act.terms, lambda: False)


def test_revoke_is_acked_after_leader_work_stops() -> None:
    a, clock = setup()
    grant(a, clock, "orders", seq(clock), 5000)
    w1, w2 = a.begin_leading("orders"), a.begin_leading("orders")
    act = revoke(a, "orders", seq(clock, 1))
    assert isinstance(act, RevokeWait)
    assert w1.stopping.is_set() and w2.stopping.is_set()
    with pytest.raises(handoff.NotLeader):
        a.begin_leading("orders")
    acked = threading.Event()
    threading.Thread(target=lambda: a._wait_leader_work("orders", act.terms, lambda: False) and acked.set()).start()
    w1.done()
    assert not acked.wait(0.3), "acked with leader work still running"
    w2.done()
    w2.done()  # idempotent
    assert acked.wait(5)


def test_leading_lists_the_leases_led_and_changes_are_told() -> None:
    a, clock = setup()
    changed = a.leadership_changed()
    grant(a, clock, "shard-2", seq(clock), 5000, token=2)
    assert changed.is_set()
    grant(a, clock, "shard-0", seq(clock), 1000, token=7)
    assert [t.lease for t in a.leading()] == ["shard-0", "shard-2"]
    assert [t.lease for t in a.leading("shard-2", "shard-1", "shard-0")] == ["shard-2", "shard-0"]
    changed = a.leadership_changed()
    clock.step(1.0)
    assert changed.is_set(), "a term running out is a change"
    assert [t.fencing_token for t in a.leading()] == [2]


def test_shards_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    assert handoff.shards_from_env() == []
    monkeypatch.setenv("HANDOFF_SHARDS", " orders-0, ,orders-1 ")
    assert handoff.shards_from_env() == ["orders-0", "orders-1"]


def test_leadership_continues_after_stop_claiming() -> None:
    a, clock = setup()
    a.stop_claiming()
    assert grant(a, clock, "orders", seq(clock), 5000) == (200, {"leader": True})
    with a.begin_leading("orders") as w:
        assert w.fencing_token == 1


def test_real_clock_ends_a_term() -> None:
    a = handoff.Agent(insecure_no_token=True)
    msg = Leadership("orders", True, time.time_ns(), "", 1, None, 150)
    answer(put(a, "orders", msg))
    w = a.begin_leading("orders")
    assert w.wait(5) and a.leader("orders") is None
    w.done()


def test_until_as_go_writes_it() -> None:
    a, clock = setup()
    until = format_rfc3339(int((clock.time() + 0.25) * 1e9))
    body = {"lease": "orders", "leader": True, "sequence": seq(clock), "fencingToken": 0, "until": until, "validForMillis": 5000}
    assert answer(put(a, "orders", body)) == (200, {"leader": True})
    t = a.leader("orders")
    assert t is not None and t.until == pytest.approx(500.25)


def test_revoke_waits_for_the_work_of_a_term_a_new_fencing_token_replaced() -> None:
    # docs/protocol.md: the app answers the revoke only after all its leader
    # work for that Lease has stopped, also work begun in an earlier term of it.
    a, clock = setup()
    grant(a, clock, "orders", seq(clock), 5000, token=3)
    old = a.begin_leading("orders")
    grant(a, clock, "orders", seq(clock, 1), 5000, token=4)
    assert old.stopping.is_set()
    new = a.begin_leading("orders")
    act = revoke(a, "orders", seq(clock, 2))
    assert isinstance(act, RevokeWait) and len(act.terms) == 2
    acked = threading.Event()
    threading.Thread(target=lambda: a._wait_leader_work("orders", act.terms, lambda: False) and acked.set()).start()
    new.done()
    assert not acked.wait(0.3), "acked while the replaced term's leader work runs"
    old.done()
    assert acked.wait(5)
    # Once acked, nothing is left to wait for at the next revoke.
    grant(a, clock, "orders", seq(clock, 3), 5000, token=5)
    assert revoke(a, "orders", seq(clock, 4)).terms[0].work == 0


def test_replaced_term_without_work_is_not_waited_for() -> None:
    a, clock = setup()
    grant(a, clock, "orders", seq(clock), 5000, token=3)
    with a.begin_leading("orders"):
        pass
    grant(a, clock, "orders", seq(clock, 1), 5000, token=4)
    act = revoke(a, "orders", seq(clock, 2))
    assert isinstance(act, RevokeWait) and len(act.terms) == 1
    assert a._wait_leader_work("orders", act.terms, lambda: False)
