"""A real handover between two Celery workers, each beside its own handoff sidecar, on RabbitMQ.

Worker A (prefork, 4 processes, prefetch 16) takes a burst of tasks, two of
them longer than the drain window; worker B (threads, 16) starts, and a
stream of short tasks of varied durations flows to both. Then A is shut
down as the kubelet does it: ``handoff prestop`` on A's control socket
(the sidecar stops A's claiming, drains, returns at the deadline), then
SIGTERM to A's worker once the hook returns, SIGKILL at the grace period.

Checked, from the ledger the tasks write to (Redis): every task applied
exactly once (0 lost, 0 applied twice; a task A handed back while it ran
may run to its end on both, and the second finds its dedup key), A starts
nothing after stop-claiming, every task A handed back (prefetched ones at
stop-claiming, running ones at the deadline) starts on B, and how long
after the hand-back (printed: p50 and max). Needs HANDOFF_BIN (test.sh
builds it), python3-celery, python3-redis, redis-server, rabbitmq-server.
"""

from __future__ import annotations

import os
import random
import re
import tempfile
import threading
import time
from typing import Any, Dict, List, Tuple

import pytest

import celeryrig
from celeryrig import BIN, Pod, Servers, events

pytestmark = pytest.mark.skipif(not BIN or bool(celeryrig.missing()), reason=celeryrig.missing() or "HANDOFF_BIN is not set: build handoff (go build -o /tmp/handoff ./cmd/handoff) and set it")

GRACE = 8.0  # terminationGracePeriodSeconds: deadline 6s after the hook (margin 2s), drain 4s (reserve 2s)
LONG = 9.0  # longer than the drain window: running at the deadline


def percentile(xs: List[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p * (len(s) - 1))))]


class Producer:
    def __init__(self, broker: str) -> None:
        from celery import Celery

        self.app = Celery("producer", broker=broker)
        self.app.conf.task_default_queue = "handoff-example"
        self.keys: List[str] = []
        self.stop = threading.Event()
        self.rng = random.Random(23)

    def send(self, key: str, seconds: float) -> None:
        self.app.send_task("handoff_example.work", args=[key, 1, seconds], queue="handoff-example")
        self.keys.append(key)

    def stream(self, per_second: float) -> None:
        i = 0
        while not self.stop.wait(1.0 / per_second):
            self.send("s%03d" % i, self.rng.choice([0.05, 0.1, 0.2, 0.4, 0.8, 1.5]))
            i += 1


def test_handover(celery_servers: Servers) -> None:
    servers = celery_servers
    d = tempfile.mkdtemp(prefix="hho", dir="/tmp")
    ledger = servers.ledger()
    ledger.flushdb()
    prod = Producer(servers.amqp_url)
    pods: List[Pod] = []
    streaming = threading.Thread(target=prod.stream, args=(10.0,), daemon=True)
    try:
        a = Pod(d, "a", servers.amqp_url, servers.redis_url, "prefork", 4, prefetch=4, grace="%gs" % GRACE)
        pods.append(a)
        a.wait_ready()
        # The burst A alone takes (4 running, 12 prefetched): two longer than the drain window.
        durations = [LONG, LONG, 0.5, 1.0] + [prod.rng.choice([0.3, 0.7, 1.2, 2.0, 3.0]) for _ in range(12)]
        for i, s in enumerate(durations):
            prod.send("b%02d" % i, s)
        burst = time.time()
        b = Pod(d, "b", servers.amqp_url, servers.redis_url, "threads", 16, prefetch=4, grace="%gs" % GRACE)
        pods.append(b)
        b.wait_ready()
        streaming.start()
        time.sleep(max(0.0, burst + 2.5 - time.time()))

        # The kubelet: the preStop hook, then SIGTERM once it returns, SIGKILL at the grace period.
        hook = time.time()
        out = a.prestop()
        hook_took = time.time() - hook
        print("\npreStop of A (%.1fs):\n%s" % (hook_took, out))
        a.terminate(a.worker, max(0.1, hook + GRACE - time.time()))
        a.terminate(a.sidecar, 5.0)
        time.sleep(1.0)
        prod.stop.set()
        streaming.join()

        # Everything published is applied, by A before or B after, and every
        # run B began is over (B's copy of a task A handed back while it ran too).
        want = len(prod.keys)
        end = time.monotonic() + 40
        while time.monotonic() < end and not (int(ledger.get("total") or 0) >= want and _b_idle(events(ledger))):
            time.sleep(0.1)
        evs = events(ledger)
        figures = _check(prod.keys, evs, ledger, a, b, out)
        print(figures)
    finally:
        prod.stop.set()
        for p in pods:
            p.stop()
        for p in pods:
            print("--- %s worker log (tail):\n%s" % (p.name, p.log()[-1500:]))
        celeryrig.rmtree(d)


def _b_idle(evs: List[Dict[str, Any]]) -> bool:
    """Every task B started has ended (applied, or found its key applied)."""
    n = 0
    for e in evs:
        if e["worker"] == "b":
            n += 1 if e["event"] == "start" else -1 if e["event"] in ("applied", "duplicate") else 0
    return n == 0


def _check(keys: List[str], evs: List[Dict[str, Any]], ledger: Any, a: Pod, b: Pod, hook_out: str) -> str:
    applied: Dict[str, int] = {}
    starts: Dict[Tuple[str, str], List[float]] = {}
    for e in evs:
        if e["event"] == "applied":
            applied[e["key"]] = applied.get(e["key"], 0) + 1
        if e["event"] == "start":
            starts.setdefault((e["worker"], e["task_id"]), []).append(e["t"])
    lost = [k for k in keys if applied.get(k, 0) == 0]
    twice = [k for k in keys if applied.get(k, 0) > 1]
    runs = {k.decode(): int(v) for k, v in ledger.hgetall("runs").items()}
    ran_twice = sorted(k for k, v in runs.items() if v > 1)
    total = int(ledger.get("total") or 0)
    assert not lost, "lost: %s" % lost
    assert not twice, "applied twice: %s" % twice
    assert total == len(keys), "total %d, want %d (one per task)" % (total, len(keys))

    back = [e for e in evs if e["event"] == "handed-back"]
    assert back and all(e["worker"] == "a" for e in back), back
    unstarted = [e for e in back if e["why"] == "stop-claiming"]
    deadline = [e for e in back if e["why"] == "deadline"]
    assert unstarted, "A handed back nothing at stop-claiming:\n%s" % hook_out
    assert deadline, "A returned nothing at the deadline:\n%s" % hook_out
    m = re.search(r"stop-claiming\s+(\d+) in flight, (\d+) of them unstarted", hook_out)
    assert m and int(m.group(2)) == len(unstarted), hook_out
    in_flight = int(m.group(1))
    m = re.search(r"return: (\d+) returned", hook_out)
    assert m and int(m.group(1)) == len(deadline), hook_out

    # Stop-claiming stopped A's consuming: nothing handed back started on A,
    # nothing started on A after (its loop canceled the consumer before the
    # rejects; a task a process took just before may log its start a moment later).
    stopped = min(e["t"] for e in unstarted)
    for e in back:
        assert not [t for t in starts.get(("a", e["task_id"]), []) if t > e["t"]], "A started %s after handing it back" % e["task_id"]
    late = [(tid, t) for (w, tid), ts in starts.items() if w == "a" for t in ts if t > stopped + 0.5]
    assert not late, "A started tasks after stop-claiming: %s" % late

    # Every task handed back starts on B: how long after it went back.
    lat: Dict[str, List[float]] = {"stop-claiming": [], "deadline": []}
    for e in back:
        ts = [t for t in starts.get(("b", e["task_id"]), []) if t >= e["t"] - 0.001]
        assert ts, "task %s handed back at %s never started on B" % (e["task_id"], e["why"])
        lat[e["why"]].append(max(0.0, min(ts) - e["t"]) * 1000)
    every = lat["stop-claiming"] + lat["deadline"]
    assert percentile(every, 0.5) < 100, lat
    assert max(every) < 1000, lat

    for p in (a, b):
        log = p.log()
        for bad in ("Traceback", "Couldn't ack", "Couldn't reject", "MessageStateError", "PRECONDITION_FAILED", "unknown delivery tag"):
            assert bad not in log, "%s's log has %r:\n%s" % (p.name, bad, log[-3000:])

    def fig(xs: List[float]) -> str:
        return "p50 %.1f ms, max %.1f ms" % (percentile(xs, 0.5), max(xs)) if xs else "none"

    return (
        "handover figures: %d tasks, %d applied once, %d lost, %d applied twice "
        "(%d ran to the end on both A and B: the second found its dedup key)\n"
        "  A at stop-claiming: %d in flight, %d of them prefetched and not started -> handed back at once\n"
        "  A at the deadline: %d running -> handed back (reject, requeue)\n"
        "  B started them after the hand-back: prefetched %s; running %s; all %s"
        % (
            len(keys), sum(1 for k in keys if applied.get(k) == 1), len(lost), len(twice), len(ran_twice),
            in_flight, len(unstarted), len(deadline), fig(lat["stop-claiming"]), fig(lat["deadline"]), fig(every),
        )
    )
