"""The threaded Agent (Go: ``worker.Agent``) and its server."""

from __future__ import annotations

import logging
import os
import select
import socket
import threading
import time
from types import TracebackType
from typing import Callable, List, Optional, Set, Tuple, Type, cast

from ._clock import REAL_CLOCK, Clock
from ._config import agent_token, lease_duration
from ._core import ClaimBase, Core, LeaderWorkBase, ReceiveBase, _TermState
from ._endpoint import APP_SOCKET, APP_URL_ENV, Endpoint, EndpointError, listen, parse_endpoint
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
from ._auth import Verifier
from ._wire import MAX_BODY_BYTES, ReturnResult

__all__ = ["Agent", "Receive", "Claim", "LeaderWork"]

_log = logging.getLogger("handoff")

#: How long :meth:`Agent.wait_drained` waits for one ``return_claims`` call after the return fallback began, in seconds
#: from the call's start: a thread cannot be stopped, so the wait, not the call, is bounded.
CALLBACK_TIMEOUT = 10.0


class Claim(ClaimBase[threading.Event]):
    """One message the worker holds, until :meth:`done` (a ``with`` block calls it at its end).

    ``canceled`` (a :class:`threading.Event`) is set when the sidecar's
    ``cancel`` fallback cancels in-flight work at the drain deadline.
    """

    def __enter__(self) -> "Claim":
        return self

    def __exit__(self, et: Optional[Type[BaseException]], ev: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        self.done()


class Receive(ReceiveBase[threading.Event]):
    """One wait for messages, from :meth:`Agent.receive` until :meth:`end` (a ``with`` block calls it at its end).

    Wait for messages with :attr:`ended` (a :class:`threading.Event`, set at
    stop-claiming and at :meth:`end`), call :meth:`hold` for every message
    received, even after stop-claiming. Safe for concurrent use: a consumer
    whose messages arrive on callbacks may keep one Receive pending and
    hold each delivery.
    """

    def hold(self) -> Claim:
        """One message received: held, started and counted in flight until its :meth:`Claim.done`. Never refuses."""
        return cast(Claim, self._hold())

    def hold_unstarted(self, value: object = None) -> Claim:
        """One message received and not started yet (the rest of a batch, a prefetch), with the app's handle ``value``.

        Held, in flight and unstarted until :meth:`Claim.start`. At
        stop-claiming (or when held after it) the Agent takes it and hands
        it back at once through ``hand_back``; ``start`` then raises
        :class:`handoff.HandedBack`. Without ``hand_back`` it stays held like
        any other.
        """
        return cast(Claim, self._hold_unstarted(value))

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait up to ``timeout`` seconds for the wait to end (stop-claiming, or :meth:`end`); True if it has."""
        return self.ended.wait(timeout)

    def __enter__(self) -> "Receive":
        return self

    def __exit__(self, et: Optional[Type[BaseException]], ev: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        self.end()


class LeaderWork(LeaderWorkBase[threading.Event]):
    """Leader work in one term: :attr:`fencing_token`, :attr:`term`, :attr:`stopping` (a :class:`threading.Event`).

    Stop when :attr:`stopping` is set; call :meth:`done` when the work is
    over (a ``with`` block does): the revoke of the Lease is acked, and the
    Lease freed, only after that.
    """

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait up to ``timeout`` seconds for the term to end; True if it has."""
        return self.stopping.wait(timeout)

    def __enter__(self) -> "LeaderWork":
        return self

    def __exit__(self, et: Optional[Type[BaseException]], ev: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        self.done()


ReturnClaimsFn = Callable[[], int]
HandBackFn = Callable[[List[Claim]], None]


class Agent(Core[threading.Event]):
    """The worker's end of the handoff protocol (Go: ``worker.Agent``), for threaded code. Thread-safe.

    Construct it, serve the app API (:meth:`start`, or ``with Agent(...) as
    agent:``), and use :meth:`receive`, :attr:`stopping`, :meth:`leader` and
    :meth:`begin_leading` in the worker.

    Parameters (all keyword-only):

    ``return_claims``
        Hands back every claim the worker holds and has not finished (for a
        queue with a visibility timeout: make them visible now) and returns
        how many. Called at the drain deadline (:meth:`return_`), after
        in-flight work was canceled when the fallback is ``cancel``, and
        again after each claim the app ends from then on, in a thread of
        the Agent's, one call at a time. Must be safe to call more than
        once. Raise :class:`handoff.ReturnClaimsError` to report a partial
        hand-back. None: nothing is handed back.
    ``hand_back``
        Hands back claims held unstarted (:meth:`Receive.hold_unstarted`),
        given as a list (``Claim.value`` tells which messages). Called at
        stop-claiming in a thread of the Agent's, one call at a time;
        returns once every one is handed back (the Agent then ends them) or
        raises (they stay held until :meth:`return_`, which ends them after
        ``return_claims``).
    ``token``, ``token_file``
        The pod's token, else the file it is in; default the file named by
        ``$HANDOFF_TOKEN_FILE``. Read once. Without any,
        :class:`handoff.ConfigError` unless ``insecure_no_token`` (local
        development only: any process that reaches the address may then
        stop claiming or grant leadership).
    ``lease_duration``
        Seconds: the longest grant accepted (longer ones are answered
        ``422``); default ``$HANDOFF_LEASE_DURATION`` (a Go duration, like
        ``15s``), else 1 hour.
    ``clock``
        Times terms of leadership and claims (default the process's clocks;
        tests pass :class:`handoff.testing.FakeClock`). Calls are checked
        against the wall clock whatever this is.
    ``logger``
        Default ``logging.getLogger("handoff")``.
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
        max_term = _lease_duration(lease_duration)
        super().__init__(threading.Event, clock or REAL_CLOCK, max_term, logger or _log, return_claims is not None, hand_back is not None)
        self._verifier = Verifier(tok) if tok is not None else None
        self._return_claims_fn = return_claims
        self._hand_back_fn = hand_back
        self._turn = threading.Lock()  # held by whoever calls return_claims
        self._server: Optional[_Server] = None

    # The flavor's hooks.

    def _new_claim(self, value: object, state: int) -> ClaimBase[threading.Event]:
        return Claim(self, value, state)

    def _new_leader_work(self, term: _TermState[threading.Event]) -> LeaderWorkBase[threading.Event]:
        return LeaderWork(self, term)

    def _spawn_hand_back(self) -> None:
        threading.Thread(target=self._hand_back_loop, name="handoff-hand-back", daemon=True).start()

    def _spawn_return_again(self) -> None:
        threading.Thread(target=self._return_again_loop, name="handoff-return-again", daemon=True).start()

    def _hand_back_loop(self) -> None:
        assert self._hand_back_fn is not None
        while True:
            claims = self._next_hand_back()
            if not claims:
                return
            err: Optional[BaseException] = None
            try:
                self._hand_back_fn(cast(List[Claim], claims))
            except Exception as e:
                err = e
            self._hand_back_result(claims, err)

    def _return_again_loop(self) -> None:
        while True:
            self._turn.acquire()
            if not self._return_again_wanted():
                self._turn.release()
                return
            n, err = self._call_return_claims()
            if self._return_claims_fn is None:
                continue
            if err:
                self._log.error("returning claims again after the drain deadline failed (returned %d): %s", n, err)
            else:
                self._log.info("claims returned again after the drain deadline: %d", n)

    def _call_return_claims(self) -> Tuple[int, str]:
        """Call return_claims (the caller holds the turn, which this gives back), then end the failed hand-backs."""
        failed = self._return_begin()
        n, err = 0, ""
        try:
            if self._return_claims_fn is not None:
                n = int(self._return_claims_fn())
        except ReturnClaimsError as e:
            n, err = e.returned, str(e)
        except Exception as e:
            err = str(e) or type(e).__name__
        finally:
            self._call_returned()
            self._turn.release()
        self._return_end(failed)
        return n, err

    # The worker's API.

    def receive(self) -> Receive:
        """Begin a wait for messages; raises :class:`handoff.Stopping` once the worker must stop claiming.

        Wait with the Receive's :attr:`~Receive.ended` (a long poll, the pause
        between polls), :meth:`~Receive.hold` each message received, then
        :meth:`~Receive.end` (``with agent.receive() as r:`` does).
        """
        r = Receive(self)
        self._begin_receive(r)
        return r

    def begin(self) -> Claim:
        """Hold one claim at once, for work claimed the moment it begins; :class:`handoff.Stopping` once stopping.

        A wait for a message inside it counts as in flight and is not ended
        by stop-claiming: use :meth:`receive` for that.
        """
        return cast(Claim, self._begin_claim())

    def begin_leading(self, lease: str) -> LeaderWork:
        """Begin leader work for ``lease``; :class:`handoff.NotLeader` when this worker does not lead it.

        ``with agent.begin_leading("orders") as work:`` gives the fencing
        token (``work.fencing_token``) and an event set when the term ends
        (``work.stopping``). A revoke is acked only once every such block
        has ended; none begins once a revoke has been acked, until the next
        grant.
        """
        return cast(LeaderWork, self._begin_leading(lease))

    def wait_drained(self, timeout: Optional[float] = None) -> bool:
        """Wait up to ``timeout`` seconds (None: no bound) for the drain; True once drained, and the worker may exit.

        Drained is no claim held and no receive pending; from the return
        fallback on (:meth:`return_`) True also waits for ``return_`` to
        answer and for each ``return_claims`` call asked for since (one
        after each claim ended) to return, so a worker that exits then
        leaves nothing claimed. False when ``timeout`` passes first, or,
        with nothing held, when a ``return_claims`` call has run for
        :data:`CALLBACK_TIMEOUT` (10 s) without returning (logged; what it
        has not handed back waits for its visibility timeout).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            done, changed, at_most = self._wait_drained_step(CALLBACK_TIMEOUT)
            if done is not None:
                return done
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            if at_most is not None:
                left = at_most if left is None else min(left, at_most)
            changed.wait(left)

    def _wait_claims(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for no claim held and no receive pending (the cancel fallback's wait)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._mu:
                drained, changed = self._drained_locked(), self._changed
            left = deadline - time.monotonic()
            if drained or left <= 0:
                return
            changed.wait(left)

    def return_(self, cancel: bool = False, cancel_wait: float = 0.0, timeout: Optional[float] = None) -> ReturnResult:
        """The drain deadline's fallback (Go: ``Agent.Return``): hand back unfinished claims through ``return_claims``.

        It first stops claiming. With ``cancel`` it then cancels every
        claim held (``Claim.canceled``, cause :class:`handoff.Canceled`) and
        waits up to ``cancel_wait`` seconds for the worker to drain. Then it
        calls ``return_claims`` once any call under way has returned (up to
        ``timeout`` seconds; None: no bound). From then on each claim the
        app ends makes the Agent call ``return_claims`` again. The count
        returned is this call's alone. :meth:`wait_drained` waits for it,
        and for those later calls.
        """
        self._return_enter()
        try:
            self.stop_claiming()
            if cancel:
                self._cancel_work()
                self._wait_claims(max(cancel_wait, 0.0))
            if not self._turn.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
                with self._mu:
                    self._return_again_locked()
                return ReturnResult(0, "handoff: return: waiting for the hand-back under way: timed out")
            n, err = self._call_return_claims()
            if self._return_claims_fn is not None:
                if err:
                    self._log.error("returning claims failed (returned %d, cancel=%s): %s", n, cancel, err)
                else:
                    self._log.info("claims returned: %d (cancel=%s)", n, cancel)
            return ReturnResult(n, err)
        finally:
            self._return_exit()

    def _wait_leader_work(self, lease: str, terms: List[_TermState[threading.Event]], gone: Callable[[], bool]) -> bool:
        """Wait until the leader work of ``terms`` is done (True), or the caller has gone (False)."""
        while True:
            _, changed = self._leader_work_left(terms)
            if changed is None:
                self._log.info("leadership revoked: %s", lease)
                return True
            if changed.wait(0.25):
                continue
            if gone():
                return False

    # Serving.

    def start(self, url: Optional[str] = None) -> "Agent":
        """Serve the app API in background threads on ``url`` (default ``$HANDOFF_APP_URL``); returns self.

        ``url`` is ``unix:///path/app.sock`` or a loopback ``http://127.0.0.1:PORT``
        (port 0 picks one: see :attr:`url`). A socket is made at the path
        itself with mode 0666; a stale one is replaced, anything else (a
        file, a link, a socket another process serves) refused with
        :class:`handoff.EndpointError`. At most 64 connections are served at
        once; a client has 5 s to send a request and 10 s to read an answer.
        """
        if self._server is not None:
            raise RuntimeError("handoff: the Agent is serving already")
        self._server = _Server(self, _endpoint(url))
        self._server.start()
        return self

    def serve_forever(self, url: Optional[str] = None) -> None:
        """:meth:`start`, then wait until :meth:`close` (from another thread or a signal handler)."""
        self.start(url)
        assert self._server is not None
        self._server.closed.wait()

    @property
    def url(self) -> str:
        """The address served (with the port picked for port 0); empty when not serving."""
        return self._server.url if self._server is not None else ""

    def close(self) -> None:
        """Stop serving: close the listener and connections, and remove the socket. The worker's state is kept."""
        s, self._server = self._server, None
        if s is not None:
            s.close()

    def __enter__(self) -> "Agent":
        if self._server is None:
            self.start()
        return self

    def __exit__(self, et: Optional[Type[BaseException]], ev: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        self.close()


def _lease_duration(v: Optional[float]) -> float:
    return lease_duration(v)


def _endpoint(url: Optional[str]) -> Endpoint:
    if url:
        return parse_endpoint(url)
    env = os.environ.get(APP_URL_ENV, "")
    if not env:
        raise EndpointError(
            "handoff app address: none given and %s is not set (the handoff injector sets it to unix://%s)" % (APP_URL_ENV, APP_SOCKET)
        )
    try:
        return parse_endpoint(env)
    except EndpointError as e:
        raise EndpointError("handoff app environment variable %s: %s" % (APP_URL_ENV, e)) from None


class _Gone(Exception):
    """The connection ended, or a client was too slow."""


class _Reader:
    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buf = bytearray()
        self.deadline = 0.0  # of the request being read

    def _fill(self, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise _Gone()
        self._sock.settimeout(left)
        try:
            data = self._sock.recv(65536)
        except (socket.timeout, OSError):
            raise _Gone() from None
        if not data:
            raise _Gone()
        self._buf += data

    def head(self) -> Optional[bytes]:
        """The next request head; None when the client is done (EOF or idle past the bound)."""
        try:
            while not self._buf.lstrip(b"\r\n"):
                self._buf.clear()
                self._fill(time.monotonic() + IDLE_TIMEOUT)
        except _Gone:
            return None
        del self._buf[: len(self._buf) - len(self._buf.lstrip(b"\r\n"))]
        deadline = time.monotonic() + READ_TIMEOUT
        self.deadline = deadline
        while True:
            i, n = self._buf.find(b"\r\n\r\n"), 4
            j = self._buf.find(b"\n\n")
            if j >= 0 and (i < 0 or j < i):
                i, n = j, 2
            if i >= 0:
                out = bytes(self._buf[: i + n])
                del self._buf[: i + n]
                return out
            if len(self._buf) > MAX_HEADER_BYTES:
                raise HTTPError(431, "request header too large: want at most %d bytes" % MAX_HEADER_BYTES)
            self._fill(deadline)

    def exact(self, n: int) -> bytes:
        while len(self._buf) < n:
            self._fill(self.deadline)
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    def line(self) -> bytes:
        while True:
            i = self._buf.find(b"\n")
            if i >= 0:
                out = bytes(self._buf[: i + 1])
                del self._buf[: i + 1]
                return out.rstrip(b"\r\n")
            if len(self._buf) > 4096:
                raise HTTPError(400, "malformed chunked encoding")
            self._fill(self.deadline)

    def body(self, kind: str, n: int) -> Optional[bytes]:
        """The body; None when over the limit."""
        if kind == "length":
            if n > MAX_BODY_BYTES:
                return None
            return self.exact(n)
        out = bytearray()
        while True:
            size = parse_chunk_size(self.line())
            if size == 0:
                while self.line():
                    pass  # trailers
                return bytes(out)
            if len(out) + size > MAX_BODY_BYTES:
                return None
            out += self.exact(size)
            if self.line() != b"":
                raise HTTPError(400, "malformed chunked encoding")


def _linger(conn: socket.socket) -> None:
    """Close after an answer sent before the request was read whole, as Go's server does.

    Closing with unread data resets the connection, and the client may lose
    the answer: shut down the writing side, then read and drop what the
    client still sends, for up to 0.5 s and 256 KiB.
    """
    try:
        conn.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + 0.5
        n = 0
        while n < (256 << 10):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            conn.settimeout(left)
            data = conn.recv(65536)
            if not data:
                return
            n += len(data)
    except OSError:
        return


def _client_gone(conn: socket.socket) -> bool:
    """Whether the client closed its side (a read would see EOF)."""
    try:
        r, _, _ = select.select([conn], [], [], 0)
        if not r:
            return False
        conn.settimeout(0)
        try:
            return conn.recv(1, socket.MSG_PEEK) == b""
        finally:
            conn.settimeout(None)
    except BlockingIOError:
        return False
    except (OSError, ValueError):
        return True


class _Server:
    def __init__(self, agent: Agent, e: Endpoint) -> None:
        self._agent = agent
        self._e = e
        self._sock = listen(e)
        self._ino = os.stat(e.address).st_ino if e.network == "unix" else 0
        if e.network == "tcp":
            host, port = self._sock.getsockname()[:2]
            self.url = "http://%s:%d" % ("[%s]" % host if ":" in host else host, port)
        else:
            self.url = str(e)
        self._sem = threading.BoundedSemaphore(MAX_CONNS)
        self._lock = threading.Lock()
        self._conns: Set[socket.socket] = set()
        self.closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="handoff-app-api", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes accept on Linux
        except OSError:
            pass
        self._sock.close()
        if self._e.network == "unix":
            try:
                if os.stat(self._e.address).st_ino == self._ino:
                    os.remove(self._e.address)
            except OSError:
                pass
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join(2.0)

    def _accept(self) -> None:
        while not self.closed.is_set():
            self._sem.acquire()
            try:
                conn, _ = self._sock.accept()
            except OSError:
                self._sem.release()
                if self.closed.is_set():
                    return
                time.sleep(0.01)
                continue
            with self._lock:
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), name="handoff-app-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            if self._e.network == "tcp":
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            rd = _Reader(conn)
            while not self.closed.is_set():
                try:
                    raw = rd.head()
                    if raw is None:
                        return
                    head = parse_head(raw)
                    kind, n = body_framing(head)
                    if wants_continue(head, kind, n):
                        conn.sendall(CONTINUE)
                    body = rd.body(kind, n)
                except HTTPError as e:
                    self._send(conn, error_response(e.status, str(e), close=True))
                    _linger(conn)
                    return
                except _Gone:
                    return
                if body is None:
                    self._send(conn, too_large())
                    _linger(conn)
                    return
                conn.settimeout(None)
                resp = self._perform(dispatch(self._agent, self._agent._verifier, head, body), conn)
                if resp is None:
                    return
                if not head.keep_alive:
                    resp.close = True
                self._send(conn, resp)
                if resp.close:
                    return
        except OSError:
            return
        finally:
            with self._lock:
                self._conns.discard(conn)
            try:
                conn.close()
            finally:
                self._sem.release()

    def _send(self, conn: socket.socket, resp: Response) -> None:
        conn.settimeout(WRITE_TIMEOUT)
        conn.sendall(resp.render())  # one write: status line, headers and body together

    def _perform(self, a: Action, conn: socket.socket) -> Optional[Response]:
        agent = self._agent
        if isinstance(a, Response):
            return a
        if isinstance(a, DrainWait):
            deadline = time.monotonic() + a.seconds
            while True:
                with agent._mu:
                    drained, changed = agent._drained_locked(), agent._changed
                left = deadline - time.monotonic()
                if drained or left <= 0:
                    break
                if not changed.wait(min(left, 0.25)) and _client_gone(conn):
                    return None
            return drain_answer(agent.drain_status())
        if isinstance(a, ReturnCall):
            return return_answer(agent.return_(a.cancel, a.cancel_wait))
        if isinstance(a, RevokeWait):
            if not agent._wait_leader_work(a.lease, a.terms, lambda: _client_gone(conn)):
                return None
            return revoke_answer()
        raise AssertionError(a)  # pragma: no cover

