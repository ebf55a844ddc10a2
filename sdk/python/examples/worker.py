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

Under ``handoff conformance`` (``$HANDOFF_FIXTURE_SOCKET`` set by its fixture
command, ``python3 -m handoff.testing``) it serves the fixture's steps
(handoff.testing.serve_fixture) on a queue emptied at start: a test hook.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from typing import List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import handoff  # noqa: E402
import handoff.testing  # noqa: E402
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
        self.fixture: Optional[handoff.testing.FixtureHooks] = None

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
        if self.fixture is not None and self.fixture.handles(msg.body):
            self.fixture.work(msg.body, claim)  # until finish; raises handoff.Canceled: left claimed
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--queue", required=True, help="the queue's directory")
    p.add_argument("--concurrency", type=int, default=4, help="claim loops (threads)")
    p.add_argument("--lease", action="append", default=[], help="a Lease to do leader work under (repeatable); default $HANDOFF_SHARDS")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    w = Worker(FileQueue(args.queue, owner="w%d-%s" % (os.getpid(), os.urandom(3).hex())), args.concurrency)
    if os.environ.get(handoff.testing.FIXTURE_SOCKET_ENV):
        w.queue.purge()  # under the fixture each process begins on an empty queue
    w.agent.start()  # serves the app API on $HANDOFF_APP_URL, signed with $HANDOFF_TOKEN_FILE's token
    # Under handoff conformance only: None otherwise.
    w.fixture = handoff.testing.serve_fixture(w.agent, publish=w.queue.put, deliver=w.queue.deliver)
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
    if w.fixture is not None:
        w.fixture.close()
    log.info("exiting: %s", w.agent.drain_status())
    logging.shutdown()
    os._exit(0)


if __name__ == "__main__":
    main()
