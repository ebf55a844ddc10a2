"""handoff.celery in a real Celery worker (examples/celery_worker.py), driven by signed calls as the sidecar makes them.

No sidecar here: handoff.testing.Client calls the worker's app socket
(stop-claiming, drain, return, leadership), and the broker's queue is read
directly. The handover between two workers with real sidecars is
test_celery_handover.py.
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any, Callable, List

import pytest

import celeryrig
from celeryrig import Pod, Servers, events
from handoff.protocol import Leadership
from handoff.testing import Client

QUEUE = "handoff-example"


def wait(cond: Callable[[], bool], timeout: float = 15.0, what: str = "") -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("timed out waiting for %s" % (what or cond))
        time.sleep(0.02)


class Broker:
    """The task queue as the broker holds it: how many messages are ready (not delivered, or back)."""

    def __init__(self, url: str) -> None:
        from celery import Celery

        self.url = url
        self.app = Celery("producer", broker=url)
        self.app.conf.task_default_queue = QUEUE

    def send(self, key: str, seconds: float, countdown: float = 0.0) -> None:
        self.app.send_task("handoff_example.work", args=[key, 1, seconds], queue=QUEUE, countdown=countdown or None)

    def ready(self) -> int:
        if self.url.startswith("redis"):
            import redis

            return int(redis.Redis.from_url(self.url).llen(QUEUE))
        with self.app.connection_for_write() as conn:
            _, n, _ = conn.default_channel.queue_declare(QUEUE, passive=True)
            return int(n)

    def unacked(self) -> int:
        """Redis only: messages kombu holds delivered and not acknowledged."""
        import redis

        return int(redis.Redis.from_url(self.url).hlen("unacked"))

    def purge(self) -> None:
        self.app.control.purge()


def test_import_handoff_loads_no_celery() -> None:
    """The core keeps no dependency: only handoff.celery imports Celery."""
    import subprocess
    import sys

    code = "import sys, handoff, handoff.aio, handoff.protocol, handoff.testing; assert 'celery' not in sys.modules and 'kombu' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ, PYTHONPATH=os.path.join(celeryrig.SDK, "src")))


def test_install_once_per_app() -> None:
    pytest.importorskip("celery", reason="python3-celery is not installed")
    from celery import Celery

    import handoff.celery

    app = Celery("t", broker="memory://")
    h = handoff.celery.install(app, insecure_no_token=True)
    assert h.agent is None  # made in the worker process, when the worker starts
    with pytest.raises(RuntimeError):
        handoff.celery.install(app)


def client(p: Pod) -> Client:
    with open(p.token) as f:
        return Client(p.app_url, f.read().strip())


@pytest.mark.parametrize("broker,pool", [("amqp", "threads"), ("redis", "prefork")])
def test_stop_claiming_hands_back_and_return_requeues(celery_servers: Servers, broker: str, pool: str) -> None:
    """Two tasks run, three wait in the worker (two prefetched, one with a countdown): stop-claiming hands the three back
    and the worker takes nothing more; the return hands back the two running; their late ends acknowledge nothing."""
    url = celery_servers.amqp_url if broker == "amqp" else celery_servers.redis_url.rsplit("/", 1)[0] + "/1"
    q = Broker(url)
    q.purge()
    ledger = celery_servers.ledger()
    ledger.flushdb()
    d = tempfile.mkdtemp(prefix="hct", dir="/tmp")
    p = Pod(d, "w", url, celery_servers.redis_url, pool, 2, prefetch=2, sidecar=False)
    try:
        p.wait_ready()
        c = client(p)
        q.send("eta", 0.1, countdown=120)  # held in the worker's timer: unstarted
        wait(lambda: c.drain().in_flight == 1, what="the countdown task received")
        for i in range(6):
            q.send("k%d" % i, 3.0)
        # prefetch 2x2 (and one more for the countdown task): 2 running, 2 prefetched, 2 left in the queue
        wait(lambda: len([e for e in events(ledger) if e["event"] == "start"]) == 2, what="two tasks started")
        wait(lambda: (c.drain().in_flight, c.drain().unstarted) == (5, 3), what="5 held, 3 of them unstarted")
        assert q.ready() == 2

        st = c.stop_claiming()
        assert (st.stopping, st.in_flight, st.unstarted) == (True, 5, 3)
        wait(lambda: (c.drain().in_flight, c.drain().unstarted) == (2, 0), what="the unstarted handed back")
        wait(lambda: q.ready() == 5, what="the 3 handed back ready again in the broker")
        back = [e for e in events(ledger) if e["event"] == "handed-back"]
        assert sorted(e["why"] for e in back) == ["stop-claiming"] * 3

        q.send("after", 0.1)  # the worker consumes no more
        time.sleep(0.5)
        assert q.ready() == 6  # not delivered: the consumer was canceled
        st = c.drain()
        assert (st.in_flight, st.unstarted, st.receiving, st.drained) == (2, 0, 0, False)

        res = c.return_()
        assert (res.returned, res.error) == (2, "")
        wait(lambda: q.ready() == 8, what="the 2 running handed back")
        # The two run to their end here; their messages are not acknowledged again.
        assert c.drain(5000).drained
        time.sleep(0.3)
        assert q.ready() == 8
        if broker == "redis":
            assert q.unacked() == 0
        starts = [e["key"] for e in events(ledger) if e["event"] == "start"]
        assert sorted(starts) == ["k0", "k1"], starts
        log = p.log()
        for bad in ("Traceback", "Couldn't ack", "Couldn't reject", "MessageStateError", "PRECONDITION_FAILED"):
            assert bad not in log, log[-3000:]
    finally:
        p.stop()
        q.purge()
        celeryrig.rmtree(d)


def test_leader_work_is_fenced(celery_servers: Servers) -> None:
    """The example's report runs only in a term, with its fencing token; none after the revoke's ack; an older holder's write is refused."""
    ledger = celery_servers.ledger()
    ledger.flushdb()
    d = tempfile.mkdtemp(prefix="hcl", dir="/tmp")
    p = Pod(d, "w", celery_servers.amqp_url, celery_servers.redis_url, "threads", 1, sidecar=False)
    lease = "handoff-example-report"
    try:
        p.wait_ready()
        c = client(p)

        def reports(kind: str = "report") -> List[Any]:
            return [e for e in events(ledger) if e["event"] == kind]

        time.sleep(0.3)
        assert not reports()
        c.lead(Leadership(lease=lease, leader=True, sequence=time.time_ns(), fencing_token=5, valid_for_millis=10000))
        wait(lambda: len(reports()) >= 2, what="two reports in the term")
        assert {e["fencing_token"] for e in reports()} == {5}

        ack = c.lead(Leadership(lease=lease, leader=False, sequence=time.time_ns()))
        acked = time.time()
        assert not ack.leader and not ack.stale
        time.sleep(1.5)
        assert not [e for e in reports() if e["t"] > acked], "leader work after the revoke was acked"

        # A grant with an older token (a holder the store has seen superseded): its writes are refused.
        c.lead(Leadership(lease=lease, leader=True, sequence=time.time_ns(), fencing_token=3, valid_for_millis=10000))
        wait(lambda: len(reports("report-refused")) >= 1, what="a fenced write refused")
        assert {e["fencing_token"] for e in reports("report-refused")} == {3}
        assert int(ledger.get("report:fence")) == 5
        c.lead(Leadership(lease=lease, leader=False, sequence=time.time_ns()))
    finally:
        p.stop()
        celeryrig.rmtree(d)


def test_reconnection_after_stop_claiming_consumes_nothing(celery_servers: Servers) -> None:
    """RabbitMQ closes the worker's connection after stop-claiming: the broker takes the running tasks' messages back,
    the worker reconnects and subscribes to nothing, the tasks' ends acknowledge nothing on the dead channel, the drain ends."""
    import subprocess

    q = Broker(celery_servers.amqp_url)
    q.purge()
    ledger = celery_servers.ledger()
    ledger.flushdb()
    d = tempfile.mkdtemp(prefix="hcr", dir="/tmp")
    p = Pod(d, "w", celery_servers.amqp_url, celery_servers.redis_url, "threads", 2, prefetch=2, sidecar=False)
    try:
        p.wait_ready()
        c = client(p)
        for i in range(3):
            q.send("r%d" % i, 3.0)
        wait(lambda: (c.drain().in_flight, c.drain().unstarted) == (3, 1), what="2 running, 1 prefetched")
        wait(lambda: len([e for e in events(ledger) if e["event"] == "start"]) == 2, what="two tasks started")
        c.stop_claiming()
        wait(lambda: q.ready() == 1, what="the prefetched one handed back")

        with open(os.path.join(celery_servers.rabbit_dir, "port")) as f:
            node = "handoff%s@localhost" % f.read().strip()
        subprocess.run(
            ["/usr/lib/rabbitmq/bin/rabbitmqctl", "-n", node, "close_all_connections", "test"],
            env=dict(os.environ, HOME=celery_servers.rabbit_dir), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60,
        )
        wait(lambda: q.ready() == 3, what="the running tasks' messages back in the queue")
        wait(lambda: p.log().count("Connected to amqp") == 2, what="the worker reconnected")
        q.send("after", 0.1)
        assert c.drain(8000).drained  # the two running end; nothing else came
        time.sleep(0.3)
        assert q.ready() == 4
        assert [e["event"] for e in events(ledger) if e["event"] in ("start", "handed-back")] == ["start", "start", "handed-back"]
        log = p.log()
        for bad in ("Couldn't ack", "Couldn't reject", "MessageStateError"):
            assert bad not in log, log[-3000:]
    finally:
        p.stop()
        q.purge()
        celeryrig.rmtree(d)
