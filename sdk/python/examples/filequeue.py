"""A small queue in a directory, with claims the way a queue with a visibility timeout has them.

A message is a file. ``ready/ID`` is visible; claiming it renames it, atomically,
to ``claimed/OWNER.ID``, invisible to every other worker; acknowledging
deletes it; handing it back renames it to ``ready/ID`` again. Several
processes may share one directory. (There is no visibility timeout: a
message a dead worker had claimed stays claimed; ``requeue_all`` gives
such messages back.)
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Iterable, List, Optional


@dataclass(frozen=True)
class Message:
    id: str
    body: str


class FileQueue:
    def __init__(self, root: str, owner: str) -> None:
        self.root = root
        self.owner = owner
        for d in ("ready", "claimed", "tmp"):
            os.makedirs(os.path.join(root, d), exist_ok=True)

    def _path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def put(self, body: str) -> str:
        """Enqueue a message; returns its id (ids sort in the order put)."""
        mid = "%020d-%s" % (time.time_ns(), os.urandom(4).hex())
        tmp = self._path("tmp", mid)
        with open(tmp, "w") as f:
            f.write(body)
        os.rename(tmp, self._path("ready", mid))
        return mid

    def deliver(self, body: str) -> Message:
        """Enqueue a message claimed by this worker at once, in one rename.

        What a broker does when it pushes a message to a prefetching
        consumer; the conformance fixtures use it to hold claims no other
        claim loop can take. A producer uses :meth:`put`.
        """
        mid = "%020d-%s" % (time.time_ns(), os.urandom(4).hex())
        tmp = self._path("tmp", mid)
        with open(tmp, "w") as f:
            f.write(body)
        os.rename(tmp, self._path("claimed", "%s.%s" % (self.owner, mid)))
        return Message(mid, body)

    def try_claim(self, limit: int = 1) -> List[Message]:
        """Claim up to ``limit`` visible messages, oldest first; none when there are none."""
        out: List[Message] = []
        for mid in sorted(os.listdir(self._path("ready"))):
            if len(out) >= limit:
                break
            dst = self._path("claimed", "%s.%s" % (self.owner, mid))
            try:
                os.rename(self._path("ready", mid), dst)  # atomic: one worker wins
            except FileNotFoundError:
                continue  # another worker claimed it first
            with open(dst) as f:
                out.append(Message(mid, f.read()))
        return out

    def ack(self, msg: Message) -> bool:
        """Delete a message this worker claimed; False if it is no longer claimed by it (handed back)."""
        try:
            os.remove(self._path("claimed", "%s.%s" % (self.owner, msg.id)))
            return True
        except FileNotFoundError:
            return False

    def make_visible(self, msgs: Optional[Iterable[Message]] = None) -> int:
        """Hand back the messages given, or every message this worker has claimed; returns how many it handed back."""
        prefix = self.owner + "."
        if msgs is None:
            ids = [n[len(prefix) :] for n in os.listdir(self._path("claimed")) if n.startswith(prefix)]
        else:
            ids = [m.id for m in msgs]
        n = 0
        for mid in ids:
            try:
                os.rename(self._path("claimed", prefix + mid), self._path("ready", mid))
                n += 1
            except FileNotFoundError:
                pass  # acknowledged, or handed back already
        return n

    def requeue_all(self) -> int:
        """Make every claimed message visible, whoever claimed it (an operator's repair after a crash)."""
        n = 0
        for name in os.listdir(self._path("claimed")):
            os.rename(self._path("claimed", name), self._path("ready", name.split(".", 1)[1]))
            n += 1
        return n

    def purge(self) -> None:
        """Delete every message, visible or claimed."""
        for d in ("ready", "claimed", "tmp"):
            for name in os.listdir(self._path(d)):
                try:
                    os.remove(self._path(d, name))
                except FileNotFoundError:
                    pass

    def counts(self) -> "tuple[int, int]":
        """(visible, claimed) messages."""
        return len(os.listdir(self._path("ready"))), len(os.listdir(self._path("claimed")))
