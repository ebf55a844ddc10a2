"""The Agent's state, shared by the threaded Agent and its asyncio twin.

This is a port of Go's package ``worker`` (agent.go, receive.go,
leader.go): claims held and started, waits for messages, the hand-back of
unstarted claims at stop-claiming, the return fallback and the hand-backs
after it, and terms of leadership on the Agent's clock. Every change is
made under one lock, never held while calling the app or waiting; what
waits (the drain long poll, a revoke's ack, ``wait_drained``) and what
calls the app's callbacks (hand-back, return) is the flavor's, threads or
asyncio tasks.

The events a flavor hands out (``E``) are ``threading.Event`` for the
threaded Agent and :class:`handoff.aio.AsyncEvent` for the asyncio one;
both can be set from any thread. Like a Go channel closed and replaced,
``_changed`` is set and replaced at every change a waiter may care about.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Callable, Dict, Generic, List, Optional, Set, Tuple, TypeVar

from typing import Protocol

from ._clock import Clock, Timer
from ._config import MAX_SEQUENCE_AHEAD_NS
from ._errors import Canceled, ClaimDone, HandedBack, NotLeader, Stopping
from ._wire import DrainStatus

__all__ = ["Term", "Signal"]


class Signal(Protocol):
    """What the core needs of an event: set it, and ask whether it is set."""

    def set(self) -> None:
        ...

    def is_set(self) -> bool:
        ...


E = TypeVar("E", bound=Signal)

# Where a claim is.
_STARTED = 0  # Hold, Begin, or Start
_UNSTARTED = 1  # HoldUnstarted, not yet started
_HANDED_BACK = 2  # taken at stop-claiming: the Agent hands it back and ends it
_DONE = 3  # Done


@dataclass(frozen=True)
class Term:
    """One term as leader of a Lease, as the sidecar told it (Go: ``worker.Leadership``).

    ``fencing_token`` grows with each new holder of the Lease: pass it to the
    systems leader work writes to, so that they refuse an older holder.
    ``until`` is when the term ends unless renewed, in seconds on the
    Agent's monotonic clock (:func:`time.monotonic` by default), so it runs
    out even if the sidecar is gone: the earlier of the grant's ``until``
    and its receipt plus ``validForMillis``.
    """

    lease: str
    fencing_token: int
    until: float


class ClaimBase(Generic[E]):
    """One message the worker holds, from ``hold()``, ``hold_unstarted()`` (or ``begin()``) until :meth:`done`."""

    def __init__(self, core: "Core[E]", value: object, state: int) -> None:
        self._core = core
        self._value = value
        self._state = state
        self._taken = False  # taken at stop-claiming to hand back
        self._started: Optional[float] = None  # when started, on the Agent's monotonic clock
        #: Set when the sidecar's ``cancel`` fallback cancels in-flight work at the drain
        #: deadline (``cause`` is then :class:`Canceled`); not at stop-claiming.
        self.canceled: E = core._new_event()
        #: Why :attr:`canceled` is set: a :class:`Canceled`, or None.
        self.cause: Optional[BaseException] = None

    @property
    def value(self) -> object:
        """The value given to ``hold_unstarted`` (None for ``hold`` and ``begin``)."""
        return self._value

    def start(self) -> None:
        """Start work on a claim held unstarted: from now on stop-claiming leaves it to drain.

        Does nothing for a claim started already (``hold``, ``begin``).
        Raises :class:`HandedBack` if stop-claiming took the claim to hand it
        back (drop the message: the Agent ends the claim, ``done`` does
        nothing), :class:`ClaimDone` after :meth:`done`.
        """
        c = self._core
        with c._mu:
            if self._taken:
                raise HandedBack()
            if self._state == _UNSTARTED:
                self._state = _STARTED
                self._started = c._clock.monotonic()
                c._unstarted -= 1
                c._changed_locked()
            elif self._state == _DONE:
                raise ClaimDone()

    def done(self) -> None:
        """The claim is over: finished, or handed back to the queue. Call it once the queue knows.

        Idempotent; does nothing on a claim stop-claiming took to hand back
        (the Agent ends it once ``hand_back`` has handed it back). From the
        return fallback on, each claim ended makes the Agent call
        ``return_claims`` again.
        """
        self._core._end(self, by_agent=False)

    @property
    def is_done(self) -> bool:
        """Whether the claim is over (done, or ended by the Agent after a hand-back)."""
        with self._core._mu:
            return self._state == _DONE


class ReceiveBase(Generic[E]):
    """One wait for messages: pending (not in flight, not drained either) until :meth:`end`."""

    def __init__(self, core: "Core[E]") -> None:
        self._core = core
        self._closed = False
        #: Set at stop-claiming (``cause`` is then :class:`Stopping`) and at :meth:`end`:
        #: wait for messages with it, so that stop-claiming cuts the wait off.
        self.ended: E = core._new_event()
        #: Why :attr:`ended` is set: a :class:`Stopping` at stop-claiming, else None.
        self.cause: Optional[BaseException] = None

    def _hold(self) -> ClaimBase[E]:
        c = self._core
        with c._mu:
            return c._hold_locked(_STARTED, None)

    def _hold_unstarted(self, value: object) -> ClaimBase[E]:
        c = self._core
        with c._mu:
            claim = c._hold_locked(_UNSTARTED, value)
            if c._stopped:
                c._take_locked([claim])
            return claim

    def end(self) -> None:
        """The wait is over: call it once the messages received are held, or when none came. Idempotent."""
        c = self._core
        with c._mu:
            if self._closed:
                return
            self._closed = True
            self.ended.set()
            c._receives.discard(self)
            c._changed_locked()

    def _stop(self) -> None:  # under c._mu
        if not self.ended.is_set():
            self.cause = Stopping()
            self.ended.set()


class _TermState(Generic[E]):
    def __init__(self, core: "Core[E]", lead: Term) -> None:
        self.lead = lead
        self.ended = False
        self.stop: E = core._new_event()  # set when the term ends
        self.timer: Optional[Timer] = None
        self.timer_gen = 0
        self.work = 0  # leader work begun and not done
        self.changed: E = core._new_event()  # set and replaced whenever work goes down


class LeaderWorkBase(Generic[E]):
    """Leader work begun by ``begin_leading``: ``term`` is the term, :attr:`stopping` is set when it ends.

    Call :meth:`done` when the work is over (a ``with`` block does): the
    sidecar frees the Lease only after every piece of leader work is done.
    """

    def __init__(self, core: "Core[E]", term: _TermState[E]) -> None:
        self._core = core
        self._term = term
        self._done = False
        #: The term the work runs in: its lease, fencing token and end.
        self.term: Term = term.lead
        #: Set when the term ends (revoked, replaced by a new holder's, or run out on the Agent's clock).
        self.stopping: E = term.stop

    @property
    def lease(self) -> str:
        return self.term.lease

    @property
    def fencing_token(self) -> int:
        """The term's fencing token: pass it to what the leader writes to."""
        return self.term.fencing_token

    def done(self) -> None:
        """The leader work is over; idempotent. A revoke of the Lease is acked once every piece is done."""
        c = self._core
        with c._mu:
            if self._done:
                return
            self._done = True
            t = self._term
            t.work -= 1
            t.changed.set()
            t.changed = c._new_event()


class Core(Generic[E]):
    """The state of an Agent; see the module's doc."""

    def __init__(
        self,
        new_event: Callable[[], E],
        clock: Clock,
        max_term: float,
        logger: logging.Logger,
        has_return_claims: bool,
        has_hand_back: bool,
    ) -> None:
        import threading

        self._new_event = new_event
        self._clock = clock
        self._max_term = max_term
        self._log = logger
        self._has_return_claims = has_return_claims
        self._has_hand_back = has_hand_back
        #: This process's name in the drain status: 16 random hex digits.
        self.instance = os.urandom(8).hex()
        self._mu = threading.Lock()
        self._stopped = False
        #: Set when the worker must stop claiming (stop-claiming, or the return fallback).
        self.stopping: E = new_event()
        self._held = 0
        self._unstarted = 0
        self._to_hand_back: List[ClaimBase[E]] = []
        self._handing_back = False
        self._failed: List[ClaimBase[E]] = []
        self._returned = False
        self._return_again = False
        self._returning_again = False
        # return_ calls under way, and when the return_claims call under way
        # began (time.monotonic(); None when none runs): wait_drained waits
        # for both, the call up to its bound.
        self._returning = 0
        self._call_started: Optional[float] = None
        self._receives: Set[ReceiveBase[E]] = set()
        self._claims: Set[ClaimBase[E]] = set()
        self._changed: E = new_event()
        self._work_canceled = False
        self._leases: Dict[str, _TermState[E]] = {}
        # Terms a grant with a new fencing token (or after the end) replaced
        # while their leader work still ran: a revoke of the Lease waits for
        # them too (docs/protocol.md: all leader work for that Lease).
        self._replaced: Dict[str, List[_TermState[E]]] = {}
        self._sequences: Dict[str, int] = {}
        self._lchanged: E = new_event()

    # Hooks of the flavor.

    def _new_claim(self, value: object, state: int) -> ClaimBase[E]:
        return ClaimBase(self, value, state)

    def _new_leader_work(self, term: _TermState[E]) -> LeaderWorkBase[E]:
        return LeaderWorkBase(self, term)

    def _spawn_hand_back(self) -> None:
        """Start the loop that passes taken claims to ``hand_back`` (under ``_mu``)."""
        raise NotImplementedError

    def _spawn_return_again(self) -> None:
        """Start the loop that calls ``return_claims`` while asked to (under ``_mu``)."""
        raise NotImplementedError

    # Claims.

    def _changed_locked(self) -> None:
        self._changed.set()
        self._changed = self._new_event()

    def _hold_locked(self, state: int, value: object) -> ClaimBase[E]:
        c = self._new_claim(value, state)
        if state == _STARTED:
            c._started = self._clock.monotonic()
        if self._work_canceled:
            c.cause = Canceled()
            c.canceled.set()
        self._held += 1
        self._claims.add(c)
        if state == _UNSTARTED:
            self._unstarted += 1
        self._changed_locked()
        return c

    def _end(self, c: ClaimBase[E], by_agent: bool) -> None:
        """End the claim once: for the app (``done``) unless the Agent took it; for the Agent a claim it took."""
        with self._mu:
            prev = c._state
            if prev == _DONE or c._taken != by_agent:
                return
            c._state = _DONE
            if prev in (_UNSTARTED, _HANDED_BACK):
                self._unstarted -= 1
            self._claims.discard(c)
            self._held -= 1
            self._changed_locked()
            if self._returned and not by_agent and self._has_return_claims:
                # Past the drain deadline's hand-back: the queue may still
                # have this message claimed (received after it, given up).
                self._return_again_locked()

    def _begin_receive(self, r: ReceiveBase[E]) -> None:
        with self._mu:
            if self._stopped:
                raise Stopping()
            self._receives.add(r)
            self._changed_locked()

    def _begin_claim(self) -> ClaimBase[E]:
        with self._mu:
            if self._stopped:
                raise Stopping()
            return self._hold_locked(_STARTED, None)

    @property
    def in_flight(self) -> int:
        """Claims held (``hold``, ``hold_unstarted``, ``begin``, not yet done), started or not; waits not counted."""
        with self._mu:
            return self._held

    @property
    def unstarted(self) -> int:
        """Claims among :attr:`in_flight` held unstarted and not yet started, or taken to hand back and not yet ended."""
        with self._mu:
            return self._unstarted

    @property
    def receiving(self) -> int:
        """Waits for a message pending (``receive()`` not yet ended)."""
        with self._mu:
            return len(self._receives)

    def _drained_locked(self) -> bool:
        return self._held == 0 and not self._receives

    def _wait_drained_step(self, bound: float) -> Tuple[Optional[bool], E, Optional[float]]:
        """One look for ``wait_drained``: (True, ...) once drained and every hand-back after the return fallback has returned.

        From the return fallback on, drained is not enough: ``return_`` must
        have answered and each ``return_claims`` call asked for since (one
        after each claim ended) must have returned, so that a worker that
        exits when ``wait_drained`` returns leaves nothing claimed. A call
        under way is waited for at most ``bound`` seconds from its start:
        past that, with nothing held, (False, ...): what it has not handed
        back waits for its visibility timeout. Else (None, the event set at
        the next change, the most seconds to wait before looking again).
        """
        with self._mu:
            drained, changed, started = self._drained_locked(), self._changed, self._call_started
            settled = self._returning == 0 and not self._returning_again
        if drained and settled:
            return True, changed, None
        if drained and started is not None:
            left = started + bound - time.monotonic()
            if left <= 0:
                self._log.error(
                    "wait for the drain: return_claims, called after the return fallback began, did not return within %gs; "
                    "what it has not handed back waits for its visibility timeout",
                    bound,
                )
                return False, changed, None
            return None, changed, left
        return None, changed, None

    def _return_enter(self) -> None:
        """A return_ call begins: wait_drained waits for it to answer."""
        with self._mu:
            self._returning += 1

    def _return_exit(self) -> None:
        with self._mu:
            self._returning -= 1
            self._changed_locked()

    def stop_claiming(self) -> DrainStatus:
        """Stop claiming: set :attr:`stopping`, end every pending receive (cause :class:`Stopping`) and refuse new ones.

        Claims started go on. Claims held unstarted are taken (``start``
        raises :class:`HandedBack`) and handed back at once through
        ``hand_back``, in the background. Idempotent. Returns the drain
        status when claiming stopped: the first call's before the unstarted
        claims are taken; a later call's, now.
        """
        with self._mu:
            if self._stopped:
                return self._status_locked()
            self._stopped = True
            self.stopping.set()
            for r in list(self._receives):
                r._stop()
            self._log.info(
                "stop claiming: inFlight=%d unstarted=%d receiving=%d", self._held, self._unstarted, len(self._receives)
            )
            st = self._status_locked()
            self._take_locked([c for c in self._claims if c._state == _UNSTARTED])
            return st

    def _take_locked(self, claims: List[ClaimBase[E]]) -> None:
        if not self._has_hand_back or not claims:
            return
        for c in claims:
            c._state, c._taken = _HANDED_BACK, True
        self._to_hand_back.extend(claims)
        if not self._handing_back:
            self._handing_back = True
            self._spawn_hand_back()

    def _next_hand_back(self) -> List[ClaimBase[E]]:
        """The claims taken and not yet passed to ``hand_back``; none ends the loop."""
        with self._mu:
            claims, self._to_hand_back = self._to_hand_back, []
            if not claims:
                self._handing_back = False
            return claims

    def _hand_back_result(self, claims: List[ClaimBase[E]], err: Optional[BaseException]) -> None:
        if err is not None:
            self._log.error("hand back of %d unstarted claims failed; left to the drain deadline's fallback: %s", len(claims), err)
            with self._mu:
                self._failed.extend(claims)
                if self._returned:  # the fallback has run: return_claims again, then end them
                    self._return_again_locked()
            return
        self._log.info("unstarted claims handed back: %d", len(claims))
        for c in claims:
            self._end(c, by_agent=True)

    def _cancel_work(self) -> None:
        with self._mu:
            self._work_canceled = True
            for c in self._claims:
                if not c.canceled.is_set():
                    c.cause = Canceled()
                    c.canceled.set()

    def _return_begin(self) -> List[ClaimBase[E]]:
        """Mark the fallback run (claims ending from now ask for one more call) and take the failed hand-backs."""
        with self._mu:
            self._returned, self._return_again = True, False
            failed, self._failed = self._failed, []
            self._call_started = time.monotonic()
            self._changed_locked()
            return failed

    def _call_returned(self) -> None:
        """The return_claims call under way has returned (before the turn is given back)."""
        with self._mu:
            self._call_started = None
            self._changed_locked()

    def _return_end(self, failed: List[ClaimBase[E]]) -> None:
        for c in failed:
            self._end(c, by_agent=True)

    def _return_again_locked(self) -> None:
        self._return_again = True
        if not self._returning_again:
            self._returning_again = True
            self._spawn_return_again()

    def _return_again_wanted(self) -> bool:
        """Whether another ``return_claims`` call is asked for; False ends the loop."""
        with self._mu:
            if not self._return_again:
                self._returning_again = False
                self._changed_locked()
                return False
            return True

    def drain_status(self) -> DrainStatus:
        """The drain status as the sidecar reads it."""
        with self._mu:
            return self._status_locked()

    def _status_locked(self) -> DrainStatus:
        oldest: Optional[float] = None
        for c in self._claims:
            if c._state == _STARTED and c._started is not None and (oldest is None or c._started < oldest):
                oldest = c._started
        running = 0
        if oldest is not None:
            running = max(int((self._clock.monotonic() - oldest) * 1000), 0)
        return DrainStatus(
            stopping=self._stopped,
            in_flight=self._held,
            unstarted=self._unstarted,
            receiving=len(self._receives),
            running_millis=running,
            drained=self._drained_locked(),
            instance=self.instance,
        )

    # Leadership.

    def _live_locked(self, t: Optional[_TermState[E]]) -> bool:
        return t is not None and not t.ended and self._clock.monotonic() < t.lead.until

    def leader(self, lease: str) -> Optional[Term]:
        """The current term for ``lease``; None when this worker does not lead it or the term has run out."""
        with self._mu:
            t = self._leases.get(lease)
            return t.lead if t is not None and self._live_locked(t) else None

    def leading(self, *names: str) -> List[Term]:
        """The terms led now among ``names``, in their order; with no names every one, sorted by Lease.

        For a shard set pass the shard names (:func:`handoff.shards_from_env`).
        """
        with self._mu:
            ns = list(names) if names else sorted(self._leases)
            return [t.lead for t in (self._leases.get(n) for n in ns) if t is not None and self._live_locked(t)]

    def leadership_changed(self) -> E:
        """An event set at the next change of the Leases led: a term begun or ended (renewals do not count).

        Read :meth:`leading` once it is set, and ask again for the next change.
        """
        with self._mu:
            return self._lchanged

    def _lchanged_locked(self) -> None:
        self._lchanged.set()
        self._lchanged = self._new_event()

    def _begin_leading(self, lease: str) -> LeaderWorkBase[E]:
        with self._mu:
            t = self._leases.get(lease)
            if t is None or not self._live_locked(t):
                raise NotLeader()
            t.work += 1
            return self._new_leader_work(t)

    def _schedule_end_locked(self, t: _TermState[E]) -> None:
        if t.timer is not None:
            t.timer.cancel()
        t.timer_gen += 1
        gen = t.timer_gen
        t.timer = self._clock.call_later(t.lead.until - self._clock.monotonic(), lambda: self._term_ran_out(t, gen))

    def _term_ran_out(self, t: _TermState[E], gen: int) -> None:
        with self._mu:
            if t.timer_gen != gen or t.ended:
                return  # renewed since, or ended otherwise
            t.ended = True
            t.stop.set()
            self._lchanged_locked()

    def _grant_locked(self, lease: str, fencing_token: int, until: float) -> None:
        t = self._leases.get(lease)
        if t is not None and (t.lead.fencing_token != fencing_token or t.ended):
            self._stop_term_locked(t)
            old = [o for o in self._replaced.get(lease, []) if o.work > 0]
            if t.work > 0:
                old.append(t)
            self._replaced[lease] = old
            t = None
        lead = Term(lease, fencing_token, until)
        if t is None:
            t = _TermState(self, lead)
            self._leases[lease] = t
            self._log.info("leading %s: fencingToken=%d", lease, fencing_token)
            self._lchanged_locked()
        t.lead = lead
        self._schedule_end_locked(t)

    def _stop_term_locked(self, t: _TermState[E]) -> bool:
        """End t; True if it was not over yet."""
        if t.timer is not None:
            t.timer.cancel()
            t.timer_gen += 1
        if t.ended:
            return False
        t.ended = True
        t.stop.set()
        return True

    def _end_term_locked(self, lease: str) -> List[_TermState[E]]:
        """End the term of ``lease``; the terms whose leader work a revoke waits for: it, and those replaced with work running."""
        t = self._leases.get(lease)
        terms = [o for o in self._replaced.pop(lease, []) if o.work > 0]
        if t is None:
            return terms
        if self._stop_term_locked(t):
            self._lchanged_locked()
        return terms + [t]

    def _apply_leadership(self, lease: str, seq: int, grant: Optional[Tuple[int, float]]) -> Tuple[bool, List[_TermState[E]]]:
        """Apply one message about ``lease`` if it is the latest, checking and recording ``seq`` under one hold of the lock.

        Returns (stale, the terms whose leader work a revoke waits for: every term of the Lease with work running).
        """
        with self._mu:
            last = self._sequences.get(lease)
            if last is not None and seq <= last:
                return True, []
            self._sequences[lease] = seq
            if grant is not None:
                self._grant_locked(lease, grant[0], grant[1])
                return False, []
            return False, self._end_term_locked(lease)

    def _leader_work_left(self, terms: List[_TermState[E]]) -> Tuple[int, Optional[E]]:
        """The leader work still running in ``terms``, and an event set when that of the first term with any goes down."""
        with self._mu:
            for t in terms:
                if t.work > 0:
                    return sum(o.work for o in terms), t.changed
            return 0, None

    def _genuine(self, leader: bool, seq: int, valid_for_millis: int, until_ns: Optional[int], received_wall_ns: int) -> Optional[str]:
        """Why a leadership message cannot come from the sidecar (answered 422), or None."""
        if seq > received_wall_ns and seq - received_wall_ns > MAX_SEQUENCE_AHEAD_NS:
            return (
                "body: sequence %d is %.3fs ahead of this process's clock; want a sequence (the send time in Unix nanoseconds) at most 1s ahead"
                % (seq, (seq - received_wall_ns) / 1e9)
            )
        if not leader:
            return None
        max_ms = int(self._max_term * 1000)
        if valid_for_millis > max_ms:
            return (
                "body: validForMillis %d is longer than the lease duration %gs, which bounds every term the sidecar grants; want at most %d"
                % (valid_for_millis, self._max_term, max_ms)
            )
        if until_ns is not None and until_ns - received_wall_ns > int(self._max_term * 1e9):
            return (
                "body: until is %.3fs after receipt, longer than the lease duration %gs, which bounds every term the sidecar grants; want an until at most %gs ahead"
                % ((until_ns - received_wall_ns) / 1e9, self._max_term, self._max_term)
            )
        return None
