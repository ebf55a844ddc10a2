#!/usr/bin/env python3
"""An example queue worker on the threaded handoff Agent.

It consumes a directory queue (filequeue.py) with a few threads, each
running the claim loop of the handoff protocol: receive, wait for a message
(cut off at stop-claiming), hold it, work, acknowledge, done. At the drain
deadline the sidecar's return fallback makes every message it still has
claimed visible again. With ``--lease NAME`` (or the pod's shards in
``$HANDOFF_SHARDS``) it also does leader-only work under that Lease, with
the fencing token.

    HANDOFF_TOKEN_FILE=token HANDOFF_APP_URL=unix:///tmp/w/app.sock \\
        python3 worker.py --queue /tmp/w/queue

A message body ``sleep:2.5`` works for 2.5 s (and stops at the cancel
fallback); any other body is printed.

``--control SOCKET`` serves the steps of ``handoff conformance``'s fixtures
(fixture.py sends them): a test hook, not part of a worker.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socketserver
import sys
import threading
from typing import Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import handoff  # noqa: E402
from filequeue import FileQueue, Message  # noqa: E402

log = logging.getLogger("worker")


class Worker:
    def __init__(self, queue: FileQueue, concurrency: int, poll: float = 0.05) -> None:
        self.queue = queue
        self.concurrency = concurrency
        self.poll = poll
        # return_claims: at the drain deadline (and after each claim ended
        # past it) make visible every message this worker still has claimed.
        # hand_back: at stop-claiming, those of the messages held unstarted
        # (none here but the fixture's: a worker that claims ahead of its
        # work holds them with Receive.hold_unstarted, as aio_worker.py does).
        self.agent = handoff.Agent(return_claims=queue.make_visible, hand_back=self.hand_back)
        self.hooks: Optional[ConformanceHooks] = None

    def hand_back(self, claims: List[handoff.Claim]) -> None:
        self.queue.make_visible([c.value for c in claims if isinstance(c.value, Message)])

    # The claim loop, one per thread.

    def consume(self) -> None:
        while True:
            try:
                r = self.agent.receive()
            except handoff.Stopping:
                return  # claiming has stopped: what is held drains
            with r:
                msg = self.wait_for_message(r)
                if msg is None:
                    continue
                claim = r.hold()  # held from here, even after stop-claiming
            with claim:  # claim.done() at the end: finished, or left for return_claims
                try:
                    self.handle(msg, claim)
                except Exception as e:
                    log.warning("message %s not finished (%s): left claimed, handed back at the deadline", msg.id, e)
                    continue
                if not self.queue.ack(msg):
                    log.warning("message %s finished after it was handed back", msg.id)

    def wait_for_message(self, r: handoff.Receive) -> Optional[Message]:
        """Poll the queue until a message comes or the wait ends (stop-claiming).

        The claim (a rename) runs while the receive is pending, so a message
        claimed in the race with stop-claiming is held, never dropped.
        """
        while True:
            msgs = self.queue.try_claim()
            if msgs:
                return msgs[0]
            if r.wait(self.poll):
                return None

    def handle(self, msg: Message, claim: handoff.Claim) -> None:
        if self.hooks is not None and self.hooks.handles(msg):
            self.hooks.handle(msg, claim)
            return
        if msg.body.startswith("sleep:"):
            if claim.canceled.wait(float(msg.body[len("sleep:") :])):
                raise RuntimeError("canceled at the drain deadline")
            return
        print("message %s: %s" % (msg.id, msg.body), flush=True)

    # Leader work.

    def lead(self, lease: str) -> None:
        while True:
            changed = self.agent.leadership_changed()
            try:
                with self.agent.begin_leading(lease) as work:
                    log.info("leading %s with fencing token %d", lease, work.fencing_token)
                    while not work.stopping.wait(1.0):
                        # Leader-only work goes here, its writes fenced by work.fencing_token.
                        pass
                    log.info("no longer leading %s", lease)
            except handoff.NotLeader:
                changed.wait(5.0)

    def run(self, leases: List[str]) -> None:
        for i in range(self.concurrency):
            threading.Thread(target=self.consume, name="consumer-%d" % i, daemon=True).start()
        for lease in leases:
            threading.Thread(target=self.lead, args=(lease,), name="leader-%s" % lease, daemon=True).start()


class ConformanceHooks:
    """The steps of handoff conformance's fixtures, served on a control socket (fixture.py).

    Messages whose body starts with ``conformance-held-`` work until
    ``finish``, ignoring the cancel fallback; ``conformance-cancelable-``
    ones end at the cancel fallback without acknowledging;
    ``hold-unstarted`` holds messages delivered to this worker unstarted,
    for stop-claiming to hand back.
    """

    def __init__(self, w: Worker) -> None:
        self.w = w
        self.cond = threading.Condition()
        self.release = threading.Event()  # replaced at each finish
        self.waiting = 0  # handlers that have taken their release or cancel to wait on
        self.leader_work: Dict[str, List[handoff.LeaderWork]] = {}
        self.unstarted: List[handoff.Claim] = []

    def handles(self, msg: Message) -> bool:
        return msg.body.startswith("conformance-")

    def handle(self, msg: Message, claim: handoff.Claim) -> None:
        with self.cond:
            release = self.release
            self.waiting += 1
            self.cond.notify_all()
        if msg.body.startswith("conformance-cancelable-"):
            claim.canceled.wait()
            raise RuntimeError("canceled")  # not acknowledged: still claimed in the queue
        release.wait()

    def hold(self, prefix: str, n: int) -> str:
        with self.cond:
            want = self.waiting + n
        for i in range(n):
            self.w.queue.put("%s%d" % (prefix, i))
        with self.cond:
            if not self.cond.wait_for(lambda: self.waiting >= want, 10.0):
                return "error: the worker works on %d of the %d messages put" % (self.waiting - want + n, n)
        return "ok"

    def step(self, words: List[str]) -> str:
        cmd, arg = words[0], (words[1] if len(words) > 1 else "")
        agent = self.w.agent
        if cmd == "ping":
            return "ok"
        if cmd == "hold":
            return self.hold("conformance-held-", int(arg))
        if cmd == "hold-cancelable":
            return self.hold("conformance-cancelable-", int(arg))
        if cmd == "hold-unstarted":
            # Delivered to this worker, not started: the rest of a batch.
            with agent.receive() as r:
                for i in range(int(arg)):
                    self.unstarted.append(r.hold_unstarted(self.w.queue.deliver("conformance-unstarted-%d" % i)))
            return "ok"
        if cmd == "finish":
            with self.cond:
                self.release.set()
                self.release = threading.Event()
            for c in self.unstarted:
                c.done()  # those stop-claiming did not hand back: dropped
            self.unstarted.clear()
            return "ok"
        if cmd == "lead":
            try:
                work = agent.begin_leading(arg)
            except handoff.NotLeader:
                return "no"
            self.leader_work.setdefault(arg, []).append(work)
            return "yes"
        if cmd == "stopping":
            ws = self.leader_work.get(arg, [])
            return "yes" if ws and all(w.stopping.is_set() for w in ws) else "no"
        if cmd == "release":
            for w in self.leader_work.pop(arg, []):
                w.done()
            return "ok"
        return "error: unknown step %r" % cmd

    def serve(self, path: str) -> socketserver.UnixStreamServer:
        hooks = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                line = self.rfile.readline().decode().split()
                try:
                    answer = hooks.step(line) if line else "error: empty step"
                except Exception as e:  # a bad step: tell the fixture
                    answer = "error: %s" % e
                self.wfile.write((answer + "\n").encode())

        if os.path.exists(path):
            os.remove(path)
        srv = socketserver.ThreadingUnixStreamServer(path, Handler)
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        return srv


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--queue", required=True, help="the queue's directory")
    p.add_argument("--concurrency", type=int, default=4, help="claim loops (threads)")
    p.add_argument("--lease", action="append", default=[], help="a Lease to do leader work under (repeatable); default $HANDOFF_SHARDS")
    p.add_argument("--control", help="serve handoff conformance's fixture steps on this Unix socket (tests only)")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    w = Worker(FileQueue(args.queue, owner="w%d-%s" % (os.getpid(), os.urandom(3).hex())), args.concurrency)
    w.agent.start()  # serves the app API on $HANDOFF_APP_URL, signed with $HANDOFF_TOKEN_FILE's token
    if args.control:
        w.hooks = ConformanceHooks(w)
        w.hooks.serve(args.control)
    w.run(args.lease or handoff.shards_from_env())
    log.info("serving %s, instance %s", w.agent.url, w.agent.instance)

    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    while not done.wait(1.0):
        pass
    # SIGTERM comes after the sidecar's sequence (preStop) has drained or
    # handed back the claims: stop serving and exit.
    w.agent.close()
    if args.control and os.path.exists(args.control):
        os.remove(args.control)
    log.info("exiting: %s", w.agent.drain_status())
    logging.shutdown()
    os._exit(0)


if __name__ == "__main__":
    main()
