#!/usr/bin/env python3
"""An example queue worker on the asyncio Agent (handoff.aio), with prefetch.

One receive loop claims messages from a directory queue (filequeue.py) in
batches, ahead of the work: each message is held unstarted
(``hold_unstarted``) and started when one of ``--concurrency`` slots is
free. At stop-claiming the Agent takes the messages not started yet and
``hand_back`` makes them visible again at once, for another worker, the
way RabbitMQ requeues a consumer's prefetched messages; only the work
started drains. At the drain deadline ``return_claims`` makes visible every
message still claimed. With ``--lease NAME`` (or ``$HANDOFF_SHARDS``) it
does leader-only work too.

    HANDOFF_TOKEN_FILE=token HANDOFF_APP_URL=unix:///tmp/w/app.sock \\
        python3 aio_worker.py --queue /tmp/w/queue

Under ``handoff conformance`` (``$HANDOFF_FIXTURE_SOCKET`` set by its fixture
command, ``python3 -m handoff.testing``) it serves the fixture's steps
(handoff.testing.serve_fixture_async): a test hook.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from typing import List, Optional, Set

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import handoff  # noqa: E402
import handoff.aio  # noqa: E402
import handoff.testing  # noqa: E402
from filequeue import FileQueue, Message  # noqa: E402

log = logging.getLogger("aio_worker")


class Worker:
    def __init__(self, queue: FileQueue, concurrency: int, prefetch: int, poll: float = 0.05) -> None:
        self.queue = queue
        self.prefetch = prefetch
        self.poll = poll
        self.slots = asyncio.Semaphore(concurrency)
        self.limit = concurrency + prefetch  # claims held at most
        self.agent = handoff.aio.Agent(return_claims=self.return_claims, hand_back=self.hand_back)
        self.tasks: Set["asyncio.Task[None]"] = set()
        self.fixture: Optional[handoff.testing.AsyncFixtureHooks] = None

    async def return_claims(self) -> int:
        return self.queue.make_visible()  # every message this worker still has claimed

    async def hand_back(self, claims: List[handoff.aio.Claim]) -> None:
        self.queue.make_visible([c.value for c in claims if isinstance(c.value, Message)])

    async def consume(self) -> None:
        while True:
            try:
                r = self.agent.receive()
            except handoff.Stopping:
                return
            async with r:
                room = self.limit - self.agent.in_flight
                msgs = self.queue.try_claim(room) if room > 0 else []
                if not msgs:
                    await r.wait(self.poll)  # the pause between polls, cut off at stop-claiming
                    continue
                claims = [r.hold_unstarted(m) for m in msgs]  # in flight, not started
            for c in claims:
                t = asyncio.ensure_future(self.work(c))
                self.tasks.add(t)
                t.add_done_callback(self.tasks.discard)

    async def work(self, claim: handoff.aio.Claim) -> None:
        msg = claim.value
        assert isinstance(msg, Message)
        async with self.slots:
            try:
                claim.start()
            except handoff.HandedBack:
                return  # stop-claiming gave it back to the queue: drop it
            async with claim:
                try:
                    await self.handle(msg, claim)
                except Exception as e:
                    log.warning("message %s not finished (%s): left claimed, handed back at the deadline", msg.id, e)
                    return
                if not self.queue.ack(msg):
                    log.warning("message %s finished after it was handed back", msg.id)

    async def handle(self, msg: Message, claim: handoff.aio.Claim) -> None:
        if self.fixture is not None and self.fixture.handles(msg.body):
            await self.fixture.work(msg.body, claim)  # until finish; raises handoff.Canceled: left claimed
            return
        if msg.body.startswith("sleep:"):
            try:
                await asyncio.wait_for(claim.canceled.wait(), float(msg.body[len("sleep:") :]))
            except asyncio.TimeoutError:
                return
            raise RuntimeError("canceled at the drain deadline")
        print("message %s: %s" % (msg.id, msg.body), flush=True)

    async def lead(self, lease: str) -> None:
        while True:
            changed = self.agent.leadership_changed()
            try:
                async with self.agent.begin_leading(lease) as work:
                    log.info("leading %s with fencing token %d", lease, work.fencing_token)
                    while not await work.wait(1.0):
                        pass  # leader-only work, its writes fenced by work.fencing_token
                    log.info("no longer leading %s", lease)
            except handoff.NotLeader:
                try:
                    await asyncio.wait_for(changed.wait(), 5.0)
                except asyncio.TimeoutError:
                    pass


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--queue", required=True, help="the queue's directory")
    p.add_argument("--concurrency", type=int, default=4, help="messages worked on at once")
    p.add_argument("--prefetch", type=int, default=2, help="messages claimed ahead of the work")
    p.add_argument("--lease", action="append", default=[], help="a Lease to do leader work under (repeatable); default $HANDOFF_SHARDS")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    w = Worker(FileQueue(args.queue, owner="a%d-%s" % (os.getpid(), os.urandom(3).hex())), args.concurrency, args.prefetch)
    if os.environ.get(handoff.testing.FIXTURE_SOCKET_ENV):
        w.queue.purge()  # under the fixture each process begins on an empty queue
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, done.set)
    loop.add_signal_handler(signal.SIGINT, done.set)
    async with w.agent:  # serves the app API on $HANDOFF_APP_URL until the block ends
        # Under handoff conformance only: None otherwise.
        w.fixture = await handoff.testing.serve_fixture_async(w.agent, publish=w.queue.put, deliver=w.queue.deliver)
        background = [asyncio.ensure_future(w.consume())]
        background += [asyncio.ensure_future(w.lead(lease)) for lease in args.lease or handoff.shards_from_env()]
        log.info("serving %s, instance %s", w.agent.url, w.agent.instance)
        await done.wait()  # SIGTERM: after the sidecar's sequence
        for t in background:
            t.cancel()
        if w.fixture is not None:
            await w.fixture.close()
    log.info("exiting: %s", w.agent.drain_status())


if __name__ == "__main__":
    asyncio.run(main())
    logging.shutdown()
    os._exit(0)  # work still waiting (held past the sequence) does not keep the process
