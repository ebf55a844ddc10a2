"""The asyncio twin of :class:`handoff.Agent`: the same semantics, an asyncio server and async callbacks.

.. code-block:: python

    import handoff, handoff.aio

    async def main() -> None:
        async with handoff.aio.Agent(return_claims=queue.make_claimed_visible) as agent:
            while True:
                try:
                    r = agent.receive()              # handoff.Stopping once claiming has stopped
                except handoff.Stopping:
                    break
                async with r:
                    msg = await queue.poll(stop=r.ended)  # cut off at stop-claiming
                    if msg is None:
                        continue
                    claim = r.hold()
                async with claim:                    # claim.done() at the end
                    await handle(msg, claim.canceled)
                    await queue.ack(msg)

The events it hands out (``Receive.ended``, ``Claim.canceled``,
``LeaderWork.stopping``, ``Agent.stopping``) are :class:`AsyncEvent`:
``await ev.wait()``, ``ev.is_set()``. They may be set from any thread, so
work run in an executor may call ``claim.done()``. Everything else runs on
the event loop the Agent was started in.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
from types import TracebackType
from typing import Any, Awaitable, Callable, Coroutine, List, Optional, Set, Tuple, Type, cast

from ._agent import _endpoint
from ._auth import Verifier
from ._clock import REAL_CLOCK, Clock
from ._config import agent_token, lease_duration
from ._core import ClaimBase, Core, LeaderWorkBase, ReceiveBase, _TermState
from ._endpoint import Endpoint, listen
from ._errors import ReturnClaimsError
from ._http import (
    CONTINUE,
    IDLE_TIMEOUT,
    MAX_CONNS,
    MAX_HEADER_BYTES,
    READ_TIMEOUT,
    WRITE_TIMEOUT,
    Action,
    DrainWait,
    HTTPError,
    Response,
    ReturnCall,
    RevokeWait,
    body_framing,
    dispatch,
    drain_answer,
    error_response,
    parse_chunk_size,
    parse_head,
    return_answer,
    revoke_answer,
    too_large,
    wants_continue,
)
from ._wire import MAX_BODY_BYTES, ReturnResult

__all__ = ["Agent", "Receive", "Claim", "LeaderWork", "AsyncEvent"]

_log = logging.getLogger("handoff")

#: The bound of one hand_back call, and of each return_claims call after the drain deadline's, in seconds; and how long
#: :meth:`Agent.wait_drained` waits for any return_claims call (the sidecar's return call's too, which the Agent does not
#: cancel) from its start.
CALLBACK_TIMEOUT = 10.0


def _wake(fut: "asyncio.Future[None]") -> None:
    if not fut.done():
        fut.set_result(None)


class AsyncEvent:
    """An event to ``await``, which any thread may set; once set it stays set."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._flag = False
        self._waiters: List[Tuple[asyncio.AbstractEventLoop, "asyncio.Future[None]"]] = []

    def is_set(self) -> bool:
        """Whether it is set."""
        return self._flag

    def set(self) -> None:
        """Set it and wake every waiter, from any thread. Idempotent."""
        with self._lock:
            if self._flag:
                return
            self._flag = True
            waiters, self._waiters = self._waiters, []
        try:
            running: Optional[asyncio.AbstractEventLoop] = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        for loop, fut in waiters:
            if loop is running:
                loop.call_soon(_wake, fut)
            else:
                try:
                    loop.call_soon_threadsafe(_wake, fut)
                except RuntimeError:
                    pass  # that loop is closed: nobody waits there any more

    async def wait(self) -> bool:
        """Wait until it is set; returns True."""
        if self._flag:
            return True
        loop = asyncio.get_running_loop()
        fut: "asyncio.Future[None]" = loop.create_future()
        entry = (loop, fut)
        with self._lock:
            if self._flag:
                return True
            self._waiters.append(entry)
        try:
            await fut
        finally:
            with self._lock:
                if entry in self._waiters:
                    self._waiters.remove(entry)
        return True

    def __repr__(self) -> str:
        return "<AsyncEvent %s>" % ("set" if self._flag else "unset")


async def _wait(ev: AsyncEvent, timeout: Optional[float]) -> bool:
    if ev.is_set():
        return True
    if timeout is None:
        return await ev.wait()
    try:
        return await asyncio.wait_for(ev.wait(), max(timeout, 0.0))
    except asyncio.TimeoutError:
        return ev.is_set()


class Claim(ClaimBase[AsyncEvent]):
    """One message the worker holds, until :meth:`done` (``async with`` or ``with`` calls it at the end).

    ``canceled`` (an :class:`AsyncEvent`) is set by the sidecar's ``cancel`` fallback.
    """

    def __enter__(self) -> "Claim":
        return self

    def __exit__(self, et: Optional[Type[BaseException]], ev: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        self.done()

    async def __aenter__(self) -> "Claim":
        return self

    async def __aexit__(self, et: Optional[Type[BaseException]], ev: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        self.done()


class Receive(ReceiveBase[AsyncEvent]):
    """One wait for messages, until :meth:`end` (``async with`` calls it); see :class:`handoff.Receive`."""

    def hold(self) -> Claim:
        """One message received: held, started and in flight until its :meth:`Claim.done`. Never refuses."""
        return cast(Claim, self._hold())

    def hold_unstarted(self, value: object = None) -> Claim:
        """One message received, not started yet; handed back through ``hand_back`` at stop-claiming. See :meth:`handoff.Receive.hold_unstarted`."""
        return cast(Claim, self._hold_unstarted(value))

    async def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait up to ``timeout`` seconds for the wait to end (stop-claiming, or :meth:`end`); True if it has."""
        return await _wait(self.ended, timeout)

    def __enter__(self) -> "Receive":
        return self

    def __exit__(self, et: Optional[Type[BaseException]], ev: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        self.end()

    async def __aenter__(self) -> "Receive":
        return self

    async def __aexit__(self, et: Optional[Type[BaseException]], ev: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        self.end()


class LeaderWork(LeaderWorkBase[AsyncEvent]):
    """Leader work in one term; see :class:`handoff.LeaderWork`. ``stopping`` is an :class:`AsyncEvent`."""

    async def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait up to ``timeout`` seconds for the term to end; True if it has."""
        return await _wait(self.stopping, timeout)

    def __enter__(self) -> "LeaderWork":
        return self

    def __exit__(self, et: Optional[Type[BaseException]], ev: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        self.done()

    async def __aenter__(self) -> "LeaderWork":
        return self

    async def __aexit__(self, et: Optional[Type[BaseException]], ev: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        self.done()


ReturnClaimsFn = Callable[[], Awaitable[int]]
HandBackFn = Callable[[List[Claim]], Awaitable[None]]


class Agent(Core[AsyncEvent]):
    """The worker's end of the handoff protocol for asyncio code; the parameters of :class:`handoff.Agent`.

    ``return_claims`` and ``hand_back`` are coroutine functions; the calls
    the Agent makes on its own (every ``hand_back``, and ``return_claims``
    after the drain deadline's call) are bounded by 10 s each
    (:func:`asyncio.wait_for`).
    """

    def __init__(
        self,
        *,
        return_claims: Optional[ReturnClaimsFn] = None,
        hand_back: Optional[HandBackFn] = None,
        token: Optional[str] = None,
        token_file: Optional[str] = None,
        insecure_no_token: bool = False,
        lease_duration: Optional[float] = None,
        clock: Optional[Clock] = None,
        logger: Optional[logging.Logger] = None,
    ) -> None:
        tok = agent_token(token, token_file, insecure_no_token)
        max_term = _lease(lease_duration)
        super().__init__(AsyncEvent, clock or REAL_CLOCK, max_term, logger or _log, return_claims is not None, hand_back is not None)
        self._verifier = Verifier(tok) if tok is not None else None
        self._return_claims_fn = return_claims
        self._hand_back_fn = hand_back
        self._turn_lock: Optional[asyncio.Lock] = None
        self._tasks: Set["asyncio.Task[None]"] = set()
        self._server: Optional[_AioServer] = None
        try:
            self._loop: Optional[asyncio.AbstractEventLoop] = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None

    # The flavor's hooks.

    def _new_claim(self, value: object, state: int) -> ClaimBase[AsyncEvent]:
        return Claim(self, value, state)

    def _new_leader_work(self, term: _TermState[AsyncEvent]) -> LeaderWorkBase[AsyncEvent]:
        return LeaderWork(self, term)

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            try:
                self._loop = asyncio.get_running_loop()
            except RuntimeError:
                raise RuntimeError("handoff.aio.Agent: no event loop: start the Agent (or call it) in a running loop") from None
        return self._loop

    def _spawn(self, coro: Callable[[], Coroutine[Any, Any, None]]) -> None:
        loop = self._event_loop()

        def go() -> None:
            t = loop.create_task(coro())
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

        try:
            running: Optional[asyncio.AbstractEventLoop] = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            go()
        else:
            loop.call_soon_threadsafe(go)

    def _spawn_hand_back(self) -> None:
        self._spawn(self._hand_back_loop)

    def _spawn_return_again(self) -> None:
        self._spawn(self._return_again_loop)

    def _turn(self) -> asyncio.Lock:
        if self._turn_lock is None:
            self._turn_lock = asyncio.Lock()
        return self._turn_lock

    async def _hand_back_loop(self) -> None:
        assert self._hand_back_fn is not None
        while True:
            claims = self._next_hand_back()
            if not claims:
                return
            err: Optional[BaseException] = None
            try:
                await asyncio.wait_for(self._hand_back_fn(cast(List[Claim], claims)), CALLBACK_TIMEOUT)
            except Exception as e:
                err = e
            self._hand_back_result(claims, err)

    async def _return_again_loop(self) -> None:
        while True:
            turn = self._turn()
            await turn.acquire()
            if not self._return_again_wanted():
                turn.release()
                return
            n, err = await self._call_return_claims(CALLBACK_TIMEOUT)
            if self._return_claims_fn is None:
                continue
            if err:
                self._log.error("returning claims again after the drain deadline failed (returned %d): %s", n, err)
            else:
                self._log.info("claims returned again after the drain deadline: %d", n)

    async def _call_return_claims(self, timeout: Optional[float]) -> Tuple[int, str]:
        failed = self._return_begin()
        n, err = 0, ""
        try:
            if self._return_claims_fn is not None:
                n = int(await asyncio.wait_for(self._return_claims_fn(), timeout))
        except ReturnClaimsError as e:
            n, err = e.returned, str(e)
        except asyncio.TimeoutError:
            err = "return_claims did not return within %gs" % (timeout or 0)
        except Exception as e:
            err = str(e) or type(e).__name__
        finally:
            self._call_returned()
            self._turn().release()
        self._return_end(failed)
        return n, err

    # The worker's API.

    def receive(self) -> Receive:
        """Begin a wait for messages; :class:`handoff.Stopping` once claiming has stopped. ``async with agent.receive() as r:``."""
        r = Receive(self)
        self._begin_receive(r)
        return r

    def begin(self) -> Claim:
        """Hold one claim at once (Go: ``Agent.Begin``); :class:`handoff.Stopping` once claiming has stopped."""
        return cast(Claim, self._begin_claim())

    def begin_leading(self, lease: str) -> LeaderWork:
        """Begin leader work for ``lease`` (``async with agent.begin_leading(lease) as work:``); :class:`handoff.NotLeader` if not leading."""
        return cast(LeaderWork, self._begin_leading(lease))

    async def wait_drained(self, timeout: Optional[float] = None) -> bool:
        """Wait up to ``timeout`` seconds (None: no bound) for the drain; True once drained, and the worker may exit.

        See :meth:`handoff.Agent.wait_drained`: from the return fallback on,
        True also waits for ``return_`` to answer and for each
        ``return_claims`` call asked for since to return. False when
        ``timeout`` passes first, or, with nothing held, when a
        ``return_claims`` call has run for :data:`CALLBACK_TIMEOUT` (10 s)
        without returning (the Agent's own calls are canceled then; the
        sidecar's return call is not, and is no longer waited for).
        """
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            done, changed, at_most = self._wait_drained_step(CALLBACK_TIMEOUT)
            if done is not None:
                return done
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                return False
            if at_most is not None:
                left = at_most if left is None else min(left, at_most)
            await _wait(changed, left)

    async def _wait_claims(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for no claim held and no receive pending (the cancel fallback's wait)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            with self._mu:
                drained, changed = self._drained_locked(), self._changed
            left = deadline - loop.time()
            if drained or left <= 0:
                return
            await _wait(changed, left)

    async def return_(self, cancel: bool = False, cancel_wait: float = 0.0, timeout: Optional[float] = None) -> ReturnResult:
        """The drain deadline's fallback; see :meth:`handoff.Agent.return_`."""
        self._event_loop()
        self._return_enter()
        try:
            self.stop_claiming()
            if cancel:
                self._cancel_work()
                await self._wait_claims(max(cancel_wait, 0.0))
            turn = self._turn()
            try:
                await asyncio.wait_for(turn.acquire(), timeout)
            except asyncio.TimeoutError:
                with self._mu:
                    self._return_again_locked()
                return ReturnResult(0, "handoff: return: waiting for the hand-back under way: timed out")
            n, err = await self._call_return_claims(None)
            if self._return_claims_fn is not None:
                if err:
                    self._log.error("returning claims failed (returned %d, cancel=%s): %s", n, cancel, err)
                else:
                    self._log.info("claims returned: %d (cancel=%s)", n, cancel)
            return ReturnResult(n, err)
        finally:
            self._return_exit()

    async def _wait_leader_work(self, lease: str, terms: List[_TermState[AsyncEvent]], gone: Callable[[], bool]) -> bool:
        """Wait until the leader work of ``terms`` is done (True), or the caller has gone (False)."""
        while True:
            _, changed = self._leader_work_left(terms)
            if changed is None:
                self._log.info("leadership revoked: %s", lease)
                return True
            if await _wait(changed, 0.25):
                continue
            if gone():
                return False

    # Serving.

    async def start(self, url: Optional[str] = None) -> "Agent":
        """Serve the app API on ``url`` (default ``$HANDOFF_APP_URL``) in this event loop; see :meth:`handoff.Agent.start`."""
        if self._server is not None:
            raise RuntimeError("handoff: the Agent is serving already")
        self._loop = asyncio.get_running_loop()
        srv = _AioServer(self, _endpoint(url))
        await srv.start()
        self._server = srv
        return self

    async def serve_forever(self, url: Optional[str] = None) -> None:
        """:meth:`start`, then wait until :meth:`close` (or cancellation, which closes)."""
        await self.start(url)
        assert self._server is not None
        try:
            await self._server.closed.wait()
        finally:
            await self.close()

    @property
    def url(self) -> str:
        """The address served (with the port picked for port 0); empty when not serving."""
        return self._server.url if self._server is not None else ""

    async def close(self) -> None:
        """Stop serving: close the listener and connections, and remove the socket."""
        s, self._server = self._server, None
        if s is not None:
            await s.close()

    async def __aenter__(self) -> "Agent":
        if self._server is None:
            await self.start()
        return self

    async def __aexit__(self, et: Optional[Type[BaseException]], ev: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        await self.close()


def _lease(v: Optional[float]) -> float:
    return lease_duration(v)


class _TooLarge(Exception):
    pass


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Close after an answer sent before the request was read whole: see handoff._agent._linger."""
    try:
        if writer.can_write_eof():
            writer.write_eof()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 0.5
        n = 0
        while n < (256 << 10):
            left = deadline - loop.time()
            if left <= 0:
                return
            data = await asyncio.wait_for(reader.read(65536), left)
            if not data:
                return
            n += len(data)
    except (OSError, asyncio.TimeoutError):
        return


class _AioServer:
    def __init__(self, agent: Agent, e: Endpoint) -> None:
        self._agent = agent
        self._e = e
        self.url = ""
        self.closed = AsyncEvent()
        self._server: Optional[asyncio.AbstractServer] = None
        self._sem: Optional[asyncio.Semaphore] = None
        self._writers: Set[asyncio.StreamWriter] = set()
        self._ino = 0

    async def start(self) -> None:
        sock = listen(self._e)
        self._sem = asyncio.Semaphore(MAX_CONNS)
        if self._e.network == "unix":
            self._ino = os.stat(self._e.address).st_ino
            self._server = await asyncio.start_unix_server(self._conn, sock=sock, limit=2 * MAX_HEADER_BYTES)
            self.url = str(self._e)
        else:
            host, port = sock.getsockname()[:2]
            self.url = "http://%s:%d" % ("[%s]" % host if ":" in host else host, port)
            self._server = await asyncio.start_server(self._conn, sock=sock, limit=2 * MAX_HEADER_BYTES)

    async def close(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            w.close()
        if self._server is not None:
            try:
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
            except asyncio.TimeoutError:
                pass
        if self._e.network == "unix":
            try:
                if os.stat(self._e.address).st_ino == self._ino:
                    os.remove(self._e.address)
            except OSError:
                pass

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._sem is not None
        self._writers.add(writer)
        try:
            async with self._sem:
                if self._e.network == "tcp":
                    sock = writer.get_extra_info("socket")
                    if sock is not None:
                        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                await self._serve(reader, writer)
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _head(self, reader: asyncio.StreamReader) -> Optional[Tuple[bytes, float]]:
        loop = asyncio.get_running_loop()
        first = b"\r\n"
        while first in (b"\r\n", b"\n"):
            try:
                first = await asyncio.wait_for(reader.readline(), IDLE_TIMEOUT)
            except asyncio.TimeoutError:
                return None
            if not first:
                return None
        deadline = loop.time() + READ_TIMEOUT
        data = first
        line = first
        while line not in (b"\r\n", b"\n"):
            if len(data) > MAX_HEADER_BYTES:
                raise HTTPError(431, "request header too large: want at most %d bytes" % MAX_HEADER_BYTES)
            line = await asyncio.wait_for(reader.readline(), max(deadline - loop.time(), 0.001))
            if not line:
                raise asyncio.IncompleteReadError(data, None)
            data += line
        return data, deadline

    async def _body(self, reader: asyncio.StreamReader, kind: str, n: int, deadline: float) -> bytes:
        loop = asyncio.get_running_loop()

        def left() -> float:
            return max(deadline - loop.time(), 0.001)

        if kind == "length":
            if n > MAX_BODY_BYTES:
                raise _TooLarge()
            return await asyncio.wait_for(reader.readexactly(n), left())
        out = bytearray()
        while True:
            size = parse_chunk_size((await asyncio.wait_for(reader.readline(), left())).rstrip(b"\r\n"))
            if size == 0:
                while (await asyncio.wait_for(reader.readline(), left())).rstrip(b"\r\n"):
                    pass
                return bytes(out)
            if len(out) + size > MAX_BODY_BYTES:
                raise _TooLarge()
            out += await asyncio.wait_for(reader.readexactly(size), left())
            if (await asyncio.wait_for(reader.readline(), left())).rstrip(b"\r\n"):
                raise HTTPError(400, "malformed chunked encoding")

    async def _send(self, writer: asyncio.StreamWriter, resp: Response) -> None:
        writer.write(resp.render())  # one write: status line, headers and body together
        await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while not self.closed.is_set():
            try:
                got = await self._head(reader)
                if got is None:
                    return
                head = parse_head(got[0])
                kind, n = body_framing(head)
                if wants_continue(head, kind, n):
                    writer.write(CONTINUE)
                body = await self._body(reader, kind, n, got[1])
            except HTTPError as e:
                await self._send(writer, error_response(e.status, str(e), close=True))
                await _linger(reader, writer)
                return
            except _TooLarge:
                await self._send(writer, too_large())
                await _linger(reader, writer)
                return
            except ValueError:  # a line longer than the reader's limit
                await self._send(writer, error_response(431, "request header too large", close=True))
                await _linger(reader, writer)
                return
            resp = await self._perform(dispatch(self._agent, self._agent._verifier, head, body), reader)
            if resp is None:
                return
            if not head.keep_alive:
                resp.close = True
            await self._send(writer, resp)
            if resp.close:
                return

    async def _perform(self, a: Action, reader: asyncio.StreamReader) -> Optional[Response]:
        agent = self._agent

        def gone() -> bool:
            return reader.at_eof() or reader.exception() is not None

        if isinstance(a, Response):
            return a
        if isinstance(a, DrainWait):
            loop = asyncio.get_running_loop()
            deadline = loop.time() + a.seconds
            while True:
                with agent._mu:
                    drained, changed = agent._drained_locked(), agent._changed
                left = deadline - loop.time()
                if drained or left <= 0:
                    break
                if not await _wait(changed, min(left, 0.25)) and gone():
                    return None
            return drain_answer(agent.drain_status())
        if isinstance(a, ReturnCall):
            return return_answer(await agent.return_(a.cancel, a.cancel_wait))
        if isinstance(a, RevokeWait):
            if not await agent._wait_leader_work(a.lease, a.terms, gone):
                return None
            return revoke_answer()
        raise AssertionError(a)  # pragma: no cover
