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

``--control SOCKET`` serves the steps of ``handoff conformance``'s fixtures
(fixture.py --worker aio_worker.py sends them): a test hook.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from typing import Dict, List, Optional, Set

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import handoff  # noqa: E402
import handoff.aio  # noqa: E402
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
        self.hooks: Optional[ConformanceHooks] = None

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
        if self.hooks is not None and msg.body.startswith("conformance-"):
            await self.hooks.handle(msg, claim)
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


class ConformanceHooks:
    """The steps of handoff conformance's fixtures (see worker.py), for the asyncio worker."""

    def __init__(self, w: Worker) -> None:
        self.w = w
        self.release = asyncio.Event()
        self.waiting = 0
        self.leader_work: Dict[str, List[handoff.aio.LeaderWork]] = {}
        self.unstarted: List[handoff.aio.Claim] = []

    async def handle(self, msg: Message, claim: handoff.aio.Claim) -> None:
        release = self.release
        self.waiting += 1
        if msg.body.startswith("conformance-cancelable-"):
            await claim.canceled.wait()
            raise RuntimeError("canceled")  # not acknowledged: still claimed in the queue
        await release.wait()

    async def hold(self, prefix: str, n: int) -> str:
        want = self.waiting + n
        for i in range(n):
            self.w.queue.put("%s%d" % (prefix, i))
        loop = asyncio.get_running_loop()
        end = loop.time() + 10.0
        while self.waiting < want:
            if loop.time() > end:
                return "error: the worker works on %d of the %d messages put" % (self.waiting - want + n, n)
            await asyncio.sleep(0.005)
        return "ok"

    async def step(self, words: List[str]) -> str:
        cmd, arg = words[0], (words[1] if len(words) > 1 else "")
        if cmd == "ping":
            return "ok"
        if cmd == "hold":
            return await self.hold("conformance-held-", int(arg))
        if cmd == "hold-cancelable":
            return await self.hold("conformance-cancelable-", int(arg))
        if cmd == "hold-unstarted":
            # Delivered to this worker, not started: held as the claim
            # loop holds what it claims ahead, outside its loop.
            async with self.w.agent.receive() as r:
                for i in range(int(arg)):
                    self.unstarted.append(r.hold_unstarted(self.w.queue.deliver("conformance-unstarted-%d" % i)))
            return "ok"
        if cmd == "finish":
            self.release.set()
            self.release = asyncio.Event()
            for c in self.unstarted:
                c.done()  # those stop-claiming did not hand back: dropped
            self.unstarted.clear()
            return "ok"
        if cmd == "lead":
            try:
                work = self.w.agent.begin_leading(arg)
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

    async def serve(self, path: str) -> asyncio.AbstractServer:
        async def conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            words = (await reader.readline()).decode().split()
            try:
                answer = await self.step(words) if words else "error: empty step"
            except Exception as e:
                answer = "error: %s" % e
            writer.write((answer + "\n").encode())
            await writer.drain()
            writer.close()

        if os.path.exists(path):
            os.remove(path)
        return await asyncio.start_unix_server(conn, path=path)


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--queue", required=True, help="the queue's directory")
    p.add_argument("--concurrency", type=int, default=4, help="messages worked on at once")
    p.add_argument("--prefetch", type=int, default=2, help="messages claimed ahead of the work")
    p.add_argument("--lease", action="append", default=[], help="a Lease to do leader work under (repeatable); default $HANDOFF_SHARDS")
    p.add_argument("--control", help="serve handoff conformance's fixture steps on this Unix socket (tests only)")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    w = Worker(FileQueue(args.queue, owner="a%d-%s" % (os.getpid(), os.urandom(3).hex())), args.concurrency, args.prefetch)
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, done.set)
    loop.add_signal_handler(signal.SIGINT, done.set)
    async with w.agent:  # serves the app API on $HANDOFF_APP_URL until the block ends
        if args.control:
            w.hooks = ConformanceHooks(w)
            await w.hooks.serve(args.control)
        background = [asyncio.ensure_future(w.consume())]
        background += [asyncio.ensure_future(w.lead(lease)) for lease in args.lease or handoff.shards_from_env()]
        log.info("serving %s, instance %s", w.agent.url, w.agent.instance)
        await done.wait()  # SIGTERM: after the sidecar's sequence
        for t in background:
            t.cancel()
    if args.control and os.path.exists(args.control):
        os.remove(args.control)
    log.info("exiting: %s", w.agent.drain_status())


if __name__ == "__main__":
    asyncio.run(main())
    logging.shutdown()
    os._exit(0)  # work still waiting (held past the sequence) does not keep the process
