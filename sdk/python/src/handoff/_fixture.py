"""The fixture contract of ``handoff conformance`` (docs/protocol.md, "The fixture contract").

Two halves, both in :mod:`handoff.testing`:

- in the worker under test, :class:`FixtureHooks` (threaded :class:`handoff.Agent`)
  or :class:`AsyncFixtureHooks` (:class:`handoff.aio.Agent`) serve the steps on
  the Unix socket ``$HANDOFF_FIXTURE_SOCKET`` (:func:`serve_fixture`); the
  worker gives them only how to put a message in its queue and routes the
  fixture's messages to their ``work``;
- the fixture command, :func:`run_fixture` (``python3 -m handoff.testing``),
  which ``handoff conformance --fixture-cmd`` and ``--leader-cmd`` run once
  per step: ``restart`` starts a fresh worker process, every other step goes
  to that socket.

Between them, the control socket (the SDKs' own wire, the same in every
SDK, so any SDK's fixture command drives any SDK's worker): one connection
per step, the step's words and ``\\n`` in, one line out (``ok``, ``yes``,
``no``, ``unsupported``, or ``error: WHY``), sent once the step is done.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
from typing import IO, Callable, Dict, Generic, List, Optional, Sequence, TypeVar

from . import aio
from ._agent import Agent, Claim, LeaderWork
from ._errors import Canceled, NotLeader

__all__ = [
    "FIXTURE_SOCKET_ENV",
    "FIXTURE_PREFIX",
    "FixtureHooks",
    "AsyncFixtureHooks",
    "serve_fixture",
    "serve_fixture_async",
    "run_fixture",
    "fixture_main",
]

FIXTURE_SOCKET_ENV = "HANDOFF_FIXTURE_SOCKET"
"""The environment variable naming the worker's fixture socket, set by the fixture command's ``restart``."""

FIXTURE_PREFIX = "conformance-"
"""Every body the fixture puts in the queue begins with it (:meth:`FixtureHooks.handles`)."""

_HELD = FIXTURE_PREFIX + "held-"
_CANCELABLE = FIXTURE_PREFIX + "cancelable-"
_UNSTARTED = FIXTURE_PREFIX + "unstarted-"

HOLD_TIMEOUT = 20.0
"""Seconds ``hold N`` waits for the worker to work on the N messages put before it answers an error."""

_W = TypeVar("_W")  # LeaderWork of either Agent


def _count(arg: str) -> int:
    try:
        n = int(arg)
    except ValueError:
        raise ValueError("N must be an integer >= 1, got %r" % arg) from None
    if n < 1:
        raise ValueError("N must be an integer >= 1, got %d" % n)
    return n


class _Leaders(Generic[_W]):
    """lead, stopping, release: the leader work begun per Lease."""

    def __init__(self, begin: Callable[[str], _W], stopping: Callable[[_W], bool], done: Callable[[_W], None]) -> None:
        self._begin, self._stopping, self._done = begin, stopping, done
        self._mu = threading.Lock()
        self._work: Dict[str, List[_W]] = {}

    def step(self, cmd: str, lease: str) -> str:
        if not lease:
            raise ValueError("%s needs a Lease name" % cmd)
        if cmd == "lead":
            try:
                w = self._begin(lease)
            except NotLeader:
                return "no"
            with self._mu:
                self._work.setdefault(lease, []).append(w)
            return "yes"
        if cmd == "stopping":
            with self._mu:
                ws = list(self._work.get(lease, []))
            return "yes" if ws and all(self._stopping(w) for w in ws) else "no"
        with self._mu:  # release: ended, and forgotten (stopping answers no again)
            ws = self._work.pop(lease, [])
        for w in ws:
            self._done(w)
        return "ok"


class FixtureHooks:
    """The worker's half of the fixture contract, for the threaded :class:`handoff.Agent`.

    ``publish(body)`` puts one message with that body (a ``str``) in the
    worker's queue, where its own claim loops claim it. ``deliver(body)``,
    optional, returns a message claimed by this worker at once (what a
    broker pushes to a prefetching consumer), for ``hold-unstarted``;
    without it that step answers ``unsupported`` and its case is skipped.

    The worker works on a message whose body :meth:`handles` by calling
    :meth:`work` with it and its claim, held started, and acknowledges it
    when :meth:`work` returns; :meth:`work` raises :class:`handoff.Canceled`
    for work that must end unacknowledged. Serve the steps with
    :meth:`serve` (or :func:`serve_fixture`) after the Agent serves.

    Steps (docs/protocol.md, "The fixture contract"), each answered once done:

    - ``hold N``: puts N messages and answers once the worker works on all
      N (their claims counted started in ``in_flight``); that work returns
      at ``finish`` and ignores the cancel fallback.
    - ``hold-cancelable N``: the same, the work raising ``Canceled`` once the
      cancel fallback cancels its claim.
    - ``hold-unstarted N``: holds N delivered messages unstarted
      (``Receive.hold_unstarted``), for stop-claiming to hand back.
    - ``finish``: the held work returns (acknowledged by the worker); the
      unstarted claims stop-claiming did not hand back are dropped.
    - ``lead LEASE`` (``yes``/``no``), ``stopping LEASE`` (``yes`` once all
      the leader work begun for it and not released was told to stop, else
      ``no``), ``release LEASE`` (ends that leader work).
    - ``ping``: ``ok`` (the fixture command's ``restart`` waits for it).
    """

    def __init__(self, agent: Agent, publish: Callable[[str], object], deliver: Optional[Callable[[str], object]] = None) -> None:
        if not isinstance(agent, Agent):
            raise TypeError("FixtureHooks needs a handoff.Agent (for handoff.aio.Agent: AsyncFixtureHooks), got %r" % type(agent).__name__)
        self.agent = agent
        self._publish = publish
        self._deliver = deliver
        self._cond = threading.Condition()
        self._release = threading.Event()  # replaced at each finish
        self._working = 0  # calls of work for hold and hold-cancelable messages, ever
        self._seq = 0
        self._unstarted: List[Claim] = []
        self._leaders: _Leaders[LeaderWork] = _Leaders(agent.begin_leading, lambda w: w.stopping.is_set(), lambda w: w.done())
        self._server: Optional[socketserver.UnixStreamServer] = None

    @staticmethod
    def handles(body: str) -> bool:
        """Whether ``body`` is a message of the fixture's, to pass to :meth:`work`."""
        return body.startswith(FIXTURE_PREFIX)

    def work(self, body: str, claim: Claim) -> None:
        """The work on a fixture message: returns at ``finish``; raises :class:`handoff.Canceled` once the
        cancel fallback cancels ``claim`` (a ``hold-cancelable`` message: leave it unacknowledged)."""
        with self._cond:
            release = self._release
            self._working += 1
            self._cond.notify_all()
        if body.startswith(_CANCELABLE):
            claim.canceled.wait()
            raise Canceled()
        release.wait()

    def step(self, words: Sequence[str]) -> str:
        """Runs one step and returns its answer line (``error: WHY`` for a bad or failed step)."""
        try:
            return self._step(list(words))
        except Exception as e:  # the step's failure, for the fixture command's stderr
            return "error: %s" % (str(e) or type(e).__name__)

    def _step(self, words: List[str]) -> str:
        cmd, arg = (words + ["", ""])[:2]
        if cmd == "ping":
            return "ok"
        if cmd in ("hold", "hold-cancelable"):
            return self._hold(_HELD if cmd == "hold" else _CANCELABLE, _count(arg))
        if cmd == "hold-unstarted":
            n = _count(arg)
            if self._deliver is None:
                return "unsupported"
            with self.agent.receive() as r:
                for _ in range(n):
                    self._unstarted.append(r.hold_unstarted(self._deliver(self._body(_UNSTARTED))))
            return "ok"
        if cmd == "finish":
            with self._cond:
                self._release.set()
                self._release = threading.Event()
                unstarted, self._unstarted = self._unstarted, []
            for c in unstarted:
                c.done()  # those stop-claiming did not hand back: dropped
            return "ok"
        if cmd in ("lead", "stopping", "release"):
            return self._leaders.step(cmd, arg)
        if cmd == "restart":
            raise ValueError("restart is the fixture command's step (run_fixture), not the worker's")
        raise ValueError("unknown step %r" % " ".join(words))

    def _body(self, prefix: str) -> str:
        with self._cond:
            self._seq += 1
            return "%s%d-%d" % (prefix, os.getpid(), self._seq)

    def _hold(self, prefix: str, n: int) -> str:
        with self._cond:
            want = self._working + n
        for _ in range(n):
            self._publish(self._body(prefix))
        with self._cond:
            if not self._cond.wait_for(lambda: self._working >= want, HOLD_TIMEOUT):
                return "error: the worker works on %d of the %d messages put after %gs" % (n - (want - self._working), n, HOLD_TIMEOUT)
        return "ok"

    def serve(self, path: Optional[str] = None) -> str:
        """Serves the steps on the Unix socket ``path`` (default ``$HANDOFF_FIXTURE_SOCKET``) in a daemon thread; returns the path."""
        path = path or os.environ.get(FIXTURE_SOCKET_ENV, "")
        if not path:
            raise ValueError("FixtureHooks.serve: no path given and %s is not set" % FIXTURE_SOCKET_ENV)
        hooks = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                words = self.rfile.readline().decode("utf-8", "replace").split()
                self.wfile.write((hooks.step(words) if words else "error: empty step").encode() + b"\n")

        if os.path.exists(path):
            os.remove(path)
        srv = socketserver.ThreadingUnixStreamServer(path, Handler)
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, name="handoff-fixture", daemon=True).start()
        self._server = srv
        return path

    def close(self) -> None:
        """Stops serving and removes the socket."""
        if self._server is not None:
            path = self._server.server_address
            self._server.shutdown()
            self._server.server_close()
            self._server = None
            if isinstance(path, str) and os.path.exists(path):
                os.remove(path)


def serve_fixture(agent: Agent, publish: Callable[[str], object], deliver: Optional[Callable[[str], object]] = None) -> Optional[FixtureHooks]:
    """:class:`FixtureHooks` served on ``$HANDOFF_FIXTURE_SOCKET``, or None when it is not set (not under test).

    Call it once the Agent serves (after ``agent.start()``): the fixture
    command's ``restart`` answers once this socket does.
    """
    if not os.environ.get(FIXTURE_SOCKET_ENV):
        return None
    hooks = FixtureHooks(agent, publish, deliver)
    hooks.serve()
    return hooks


class AsyncFixtureHooks:
    """:class:`FixtureHooks` for :class:`handoff.aio.Agent`: ``work`` and ``step`` are coroutines, served on the event loop.

    ``publish`` and ``deliver`` are called on the loop; they may return an
    awaitable (awaited) or a value.
    """

    def __init__(self, agent: aio.Agent, publish: Callable[[str], object], deliver: Optional[Callable[[str], object]] = None) -> None:
        if not isinstance(agent, aio.Agent):
            raise TypeError("AsyncFixtureHooks needs a handoff.aio.Agent (for handoff.Agent: FixtureHooks), got %r" % type(agent).__name__)
        self.agent = agent
        self._publish = publish
        self._deliver = deliver
        self._release = asyncio.Event()
        self._changed = asyncio.Event()  # set at each work call, then replaced
        self._working = 0
        self._seq = 0
        self._unstarted: List[aio.Claim] = []
        self._leaders: _Leaders[aio.LeaderWork] = _Leaders(agent.begin_leading, lambda w: w.stopping.is_set(), lambda w: w.done())
        self._server: Optional[asyncio.AbstractServer] = None
        self._path = ""

    handles = staticmethod(FixtureHooks.handles)

    async def work(self, body: str, claim: aio.Claim) -> None:
        """See :meth:`FixtureHooks.work`."""
        release = self._release
        self._working += 1
        self._changed.set()
        self._changed = asyncio.Event()
        if body.startswith(_CANCELABLE):
            await claim.canceled.wait()
            raise Canceled()
        await release.wait()

    async def step(self, words: Sequence[str]) -> str:
        """See :meth:`FixtureHooks.step`."""
        try:
            return await self._step(list(words))
        except Exception as e:
            return "error: %s" % (str(e) or type(e).__name__)

    async def _put(self, fn: Callable[[str], object], body: str) -> object:
        v = fn(body)
        if asyncio.iscoroutine(v) or isinstance(v, asyncio.Future):
            v = await v
        return v

    async def _step(self, words: List[str]) -> str:
        cmd, arg = (words + ["", ""])[:2]
        if cmd == "ping":
            return "ok"
        if cmd in ("hold", "hold-cancelable"):
            n = _count(arg)
            want = self._working + n
            for _ in range(n):
                await self._put(self._publish, self._body(_HELD if cmd == "hold" else _CANCELABLE))
            loop = asyncio.get_running_loop()
            end = loop.time() + HOLD_TIMEOUT
            while self._working < want:
                left = end - loop.time()
                if left <= 0:
                    return "error: the worker works on %d of the %d messages put after %gs" % (n - (want - self._working), n, HOLD_TIMEOUT)
                try:
                    await asyncio.wait_for(self._changed.wait(), left)
                except asyncio.TimeoutError:
                    pass
            return "ok"
        if cmd == "hold-unstarted":
            n = _count(arg)
            if self._deliver is None:
                return "unsupported"
            values = [await self._put(self._deliver, self._body(_UNSTARTED)) for _ in range(n)]
            async with self.agent.receive() as r:
                for v in values:
                    self._unstarted.append(r.hold_unstarted(v))
            return "ok"
        if cmd == "finish":
            self._release.set()
            self._release = asyncio.Event()
            unstarted, self._unstarted = self._unstarted, []
            for c in unstarted:
                c.done()  # those stop-claiming did not hand back: dropped
            return "ok"
        if cmd in ("lead", "stopping", "release"):
            return self._leaders.step(cmd, arg)
        if cmd == "restart":
            raise ValueError("restart is the fixture command's step (run_fixture), not the worker's")
        raise ValueError("unknown step %r" % " ".join(words))

    def _body(self, prefix: str) -> str:
        self._seq += 1
        return "%s%d-%d" % (prefix, os.getpid(), self._seq)

    async def serve(self, path: Optional[str] = None) -> str:
        """Serves the steps on the Unix socket ``path`` (default ``$HANDOFF_FIXTURE_SOCKET``) on the running loop; returns the path."""
        path = path or os.environ.get(FIXTURE_SOCKET_ENV, "")
        if not path:
            raise ValueError("AsyncFixtureHooks.serve: no path given and %s is not set" % FIXTURE_SOCKET_ENV)

        async def conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                words = (await reader.readline()).decode("utf-8", "replace").split()
                writer.write((await self.step(words) if words else "error: empty step").encode() + b"\n")
                await writer.drain()
            finally:
                writer.close()

        if os.path.exists(path):
            os.remove(path)
        self._server = await asyncio.start_unix_server(conn, path=path)
        self._path = path
        return path

    async def close(self) -> None:
        """Stops serving and removes the socket."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
            if os.path.exists(self._path):
                os.remove(self._path)


async def serve_fixture_async(agent: aio.Agent, publish: Callable[[str], object], deliver: Optional[Callable[[str], object]] = None) -> Optional[AsyncFixtureHooks]:
    """:func:`serve_fixture` for :class:`handoff.aio.Agent`: :class:`AsyncFixtureHooks` on ``$HANDOFF_FIXTURE_SOCKET``, or None."""
    if not os.environ.get(FIXTURE_SOCKET_ENV):
        return None
    hooks = AsyncFixtureHooks(agent, publish, deliver)
    await hooks.serve()
    return hooks


# The fixture command.

_ONE_WORD = ("restart", "finish", "stop")
_TWO_WORDS = ("hold", "hold-cancelable", "hold-unstarted", "lead", "stopping", "release")


def _alive(pid: int) -> bool:
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is gone
    except OSError:
        try:
            os.kill(pid, 0)  # no /proc: a signal 0
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # the worker leads its own group: its children too
    except ProcessLookupError:
        pass
    except PermissionError:
        os.kill(pid, sig)


def _stop(d: str, graceful: bool) -> None:
    pidfile = os.path.join(d, "worker.pid")
    try:
        with open(pidfile) as f:
            pid = int(f.read())
    except (OSError, ValueError):
        return
    steps = [(signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)] if graceful else [(signal.SIGKILL, 5.0)]
    for sig, wait in steps:
        _signal_group(pid, sig)
        end = time.monotonic() + wait
        while _alive(pid) and time.monotonic() < end:
            time.sleep(0.01)
        if not _alive(pid):
            break
    if _alive(pid):
        raise RuntimeError("worker %d still running 5s after SIGKILL" % pid)
    os.remove(pidfile)


def _send(sock: str, words: Sequence[str], timeout: float) -> str:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(sock)
        s.sendall((" ".join(words) + "\n").encode())
        out = b""
        while not out.endswith(b"\n"):
            chunk = s.recv(4096)
            if not chunk:
                break
            out += chunk
        return out.decode("utf-8", "replace").strip()
    finally:
        s.close()


def _restart(d: str, worker: str, start_timeout: float) -> None:
    _stop(d, graceful=False)  # a fresh process, as after a kill of the worker container
    sock = os.path.join(d, "fixture.sock")
    if os.path.exists(sock):
        os.remove(sock)
    env = dict(os.environ)
    env[FIXTURE_SOCKET_ENV] = sock
    log = os.path.join(d, "worker.log")
    with open(log, "ab") as logf:
        p = subprocess.Popen(["/bin/sh", "-c", "exec " + worker], env=env, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True, close_fds=True)
    with open(os.path.join(d, "worker.pid"), "w") as f:
        f.write(str(p.pid))
    end = time.monotonic() + start_timeout
    while time.monotonic() < end:
        if p.poll() is not None:
            raise RuntimeError("the worker exited with status %s at start: see %s" % (p.returncode, log))
        try:
            if _send(sock, ["ping"], 1.0) == "ok":
                return
        except OSError:
            pass
        time.sleep(0.01)
    raise RuntimeError("the worker did not answer on %s within %gs: see %s" % (sock, start_timeout, log))


def run_fixture(d: str, worker: str, words: Sequence[str], out: Optional[IO[str]] = None, err: Optional[IO[str]] = None, start_timeout: float = 20.0) -> int:
    """Runs one step of the fixture contract as the fixture command and returns its exit status (0, or 1 on failure).

    ``d`` is a directory of the command's own (the worker's pid file
    ``worker.pid``, its log ``worker.log``, its socket ``fixture.sock``);
    ``worker`` is the worker's command, a shell command line run as ``sh -c
    'exec WORKER'``. ``restart`` kills the worker started last (SIGKILL, as
    a container is killed) and starts a fresh one with
    ``$HANDOFF_FIXTURE_SOCKET`` set and the command's environment, its
    stdin ``/dev/null`` and its output appended to the log, and returns once
    that socket answers (``start_timeout``, seconds). ``stop`` stops it
    (SIGTERM, then SIGKILL after 5 s): run it after ``handoff conformance``.
    Every other step goes to the socket; ``yes``, ``no`` and ``unsupported``
    are printed on ``out``, an ``error: ...`` answer on ``err`` with status 1.
    """
    out = out or sys.stdout
    err = err or sys.stderr
    step = " ".join(words)
    try:
        if not words:
            raise ValueError("no step given")
        if words[0] == "restart":
            _restart(d, worker, start_timeout)
            return 0
        if words[0] == "stop":
            _stop(d, graceful=True)
            return 0
        answer = _send(os.path.join(d, "fixture.sock"), words, 60.0)
        if answer in ("yes", "no", "unsupported"):
            print(answer, file=out)
        elif answer != "ok":
            raise RuntimeError(answer[len("error: ") :] if answer.startswith("error: ") else "answer %r" % answer if answer else "no answer")
        return 0
    except Exception as e:
        print("handoff fixture %s: %s" % (step, e), file=err)
        return 1


_USAGE = """usage: python3 -m handoff.testing --dir DIR --worker 'WORKER COMMAND' STEP [ARG]

The fixture command of handoff conformance (--fixture-cmd and --leader-cmd)
for a worker that serves handoff.testing.FixtureHooks: STEP is restart,
hold N, hold-cancelable N, hold-unstarted N, finish, lead LEASE, stopping
LEASE, release LEASE (appended by handoff conformance), or stop.
"""


def fixture_main(argv: Optional[Sequence[str]] = None) -> int:
    """``python3 -m handoff.testing --dir DIR --worker CMD STEP [ARG]``: :func:`run_fixture`; returns the exit status (2: usage)."""
    args = list(sys.argv[1:] if argv is None else argv)
    d, worker = "", ""
    while args and args[0].startswith("--"):
        opt = args.pop(0)
        if opt in ("--dir", "--worker") and args:
            if opt == "--dir":
                d = args.pop(0)
            else:
                worker = args.pop(0)
        else:
            print("handoff fixture: unknown option %s\n%s" % (opt, _USAGE), file=sys.stderr)
            return 2
    if not d or not worker or not args or not (args[0] in _ONE_WORD and len(args) == 1 or args[0] in _TWO_WORDS and len(args) == 2):
        print(_USAGE, file=sys.stderr)
        return 2
    return run_fixture(d, worker, args)

