"""Signed calls (docs/protocol.md, "Signed calls").

Every call between the sidecar, the hook and the worker carries three
headers::

    Handoff-Timestamp: <Unix time in milliseconds, decimal>
    Handoff-Nonce: <16 to 64 characters of A-Z a-z 0-9 - _; new for every call>
    Authorization: HANDOFF-HMAC-SHA256 <64 lowercase hex digits>

The signature is the lowercase hex HMAC-SHA256, keyed with the pod's token
(its bytes), of six lines joined by ``\\n`` with no final newline: the scheme,
the method, the request target as sent (path and query), the timestamp, the
nonce and the lowercase hex SHA-256 of the body (of no bytes without one).
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import os
import re
import threading
import time
from typing import Callable, Dict, List, Mapping, Optional, Tuple

__all__ = [
    "AUTH_SCHEME",
    "TIMESTAMP_HEADER",
    "NONCE_HEADER",
    "MAX_CLOCK_SKEW",
    "MAX_NONCES",
    "AuthError",
    "Unsigned",
    "BadSignature",
    "ClockSkew",
    "Replayed",
    "BeforeStart",
    "Busy",
    "body_digest",
    "signature",
    "new_nonce",
    "sign",
    "Verifier",
]

AUTH_SCHEME = "HANDOFF-HMAC-SHA256"
TIMESTAMP_HEADER = "Handoff-Timestamp"
NONCE_HEADER = "Handoff-Nonce"
#: How far a call's timestamp may be from the receiver's clock, either way, in seconds.
MAX_CLOCK_SKEW = 30.0
#: The most nonces a receiver remembers at once; past that it answers 503.
MAX_NONCES = 1 << 16
_MAX_TIMESTAMP_DIGITS = 15
_NONCE = re.compile(r"[A-Za-z0-9_-]{16,64}")
_TIMESTAMP = re.compile(r"[0-9]{1,15}")


class AuthError(Exception):
    """A call :meth:`Verifier.verify` refused; answered ``401`` (``503`` for :class:`Busy`)."""

    status = 401


class Unsigned(AuthError):
    """The call lacks a header of a signed call, or one is malformed."""


class BadSignature(AuthError):
    """The signature is not the token's over this call."""


class ClockSkew(AuthError):
    """The timestamp is more than 30 s from the receiver's clock."""


class Replayed(AuthError):
    """A call with this nonce was accepted before."""


class BeforeStart(AuthError):
    """The call was signed before this receiver (its :class:`Verifier`) started.

    A call captured before a restart and sent again after it: the new process
    never saw its nonce. A genuine sender meets it only when its call was in
    flight across the restart; it signs anew and retries.
    """


class Busy(AuthError):
    """65,536 nonces are remembered and none has expired: answered ``503`` with ``Retry-After: 1``."""

    status = 503


def body_digest(body: bytes) -> str:
    """The lowercase hex SHA-256 of ``body``, the last line a signature covers."""
    return hashlib.sha256(body).hexdigest()


def signature(token: str, method: str, target: str, timestamp: str, nonce: str, digest: str) -> str:
    """The lowercase hex HMAC-SHA256 of a call, keyed with ``token``.

    ``target`` is the request target as sent (path and query); ``digest`` is
    :func:`body_digest` of the body.
    """
    msg = "\n".join((AUTH_SCHEME, method, target, timestamp, nonce, digest))
    return hmac.new(token.encode(), msg.encode(), hashlib.sha256).hexdigest()


def new_nonce() -> str:
    """32 random hex digits."""
    return os.urandom(16).hex()


def sign(token: str, method: str, target: str, body: bytes = b"", now: Optional[float] = None) -> Dict[str, str]:
    """The three headers that make a call signed with ``token``.

    ``now`` is the Unix time in seconds (default: the wall clock). Sign every
    send anew: a retry needs a new nonce.
    """
    ts = str(int((time.time() if now is None else now) * 1000))
    nonce = new_nonce()
    return {
        TIMESTAMP_HEADER: ts,
        NONCE_HEADER: nonce,
        "Authorization": AUTH_SCHEME + " " + signature(token, method, target, ts, nonce, body_digest(body)),
    }


def _header(headers: Mapping[str, str], name: str) -> str:
    v = headers.get(name)
    if v is None:
        v = headers.get(name.lower(), "")
    return v


class Verifier:
    """Checks signed calls for one receiver and remembers their nonces.

    Thread-safe. ``now`` returns the Unix time in seconds (default
    :func:`time.time`: the node's wall clock, which the sidecar signs with).

    The nonces live in memory only, so a Verifier also refuses every call
    signed before it was made (:class:`BeforeStart`), to the millisecond: a
    call captured before a restart cannot be replayed to the new process.
    Make it before the receiver listens. The bound is the start itself, not
    the start less the 30 s skew: the sender and the receiver read the
    node's one clock, so no genuine call to this receiver bears an earlier
    timestamp.
    """

    def __init__(self, token: str, now: Optional[Callable[[], float]] = None, max_nonces: int = MAX_NONCES) -> None:
        self._token = token.encode()
        self._now = now or time.time
        #: The Unix time in milliseconds when the Verifier was made, truncated as a timestamp is.
        self.started_millis = int(self._now() * 1000)
        self._max = max_nonces
        self._lock = threading.Lock()
        self._seen: Dict[str, float] = {}  # nonce -> Unix seconds after which its timestamp is refused anyway
        self._expiry: List[Tuple[float, str]] = []  # heap of (until, nonce)

    def verify(self, method: str, target: str, headers: Mapping[str, str], body: bytes) -> None:
        """Check a call whose body (read whole) is ``body``; raise an :class:`AuthError` if refused.

        ``headers`` maps header names to values (:class:`email.message.Message`
        or a dict with canonical or lowercase names). The signature is
        compared in constant time and checked before the timestamp and the
        nonce, so only the token's holders learn anything or fill the nonce
        memory. A call signed before the Verifier was made raises
        :class:`BeforeStart`. On success the nonce is remembered until its timestamp is 30 s
        old.
        """
        authz = _header(headers, "Authorization")
        ts = _header(headers, TIMESTAMP_HEADER)
        nonce = _header(headers, NONCE_HEADER)
        scheme, _, sig = authz.partition(" ")
        if authz == "":
            raise Unsigned(
                "not a signed call: no Authorization header; want %r, %s and %s headers (docs/protocol.md, \"Signed calls\")"
                % (AUTH_SCHEME + " <signature>", TIMESTAMP_HEADER, NONCE_HEADER)
            )
        if scheme.upper() != AUTH_SCHEME or not scheme.isascii():
            raise Unsigned(
                "not a signed call: Authorization scheme %r; want %s (a bearer token is not accepted: the token never crosses the wire)"
                % (scheme[:24], AUTH_SCHEME)
            )
        if len(sig) != 64:
            raise Unsigned("not a signed call: the signature has %d characters; want 64 lowercase hex digits" % len(sig))
        if not _TIMESTAMP.fullmatch(ts):
            raise Unsigned(
                "not a signed call: %s %r; want the Unix time in milliseconds, a whole number of at most %d digits"
                % (TIMESTAMP_HEADER, ts[:24], _MAX_TIMESTAMP_DIGITS)
            )
        if not _NONCE.fullmatch(nonce):
            raise Unsigned("not a signed call: %s %r; want 16 to 64 characters of A-Z, a-z, 0-9, - and _" % (NONCE_HEADER, nonce[:72]))
        # The request line and headers are read as ISO-8859-1, so that
        # encoding them back gives the bytes as sent, which the signature covers.
        msg = "\n".join((AUTH_SCHEME, method, target, ts, nonce, body_digest(body)))
        want = hmac.new(self._token, msg.encode("latin-1", "replace"), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(sig.lower().encode("latin-1", "replace"), want.encode()):
            raise BadSignature("bad signature: the signature is not the pod's token's over this method, target, timestamp, nonce and body")
        at = int(ts) / 1000.0
        now = self._now()
        if abs(now - at) > MAX_CLOCK_SKEW:
            raise ClockSkew(
                "timestamp out of range: %s is %.3fs from this process's clock; want at most 30s either way" % (TIMESTAMP_HEADER, now - at)
            )
        if int(ts) < self.started_millis:
            raise BeforeStart(
                "signed before this receiver started: %s %s is %.3fs before this receiver started (%d); "
                "a call made before a restart is not accepted after it: sign it anew and retry"
                % (TIMESTAMP_HEADER, ts, (self.started_millis - int(ts)) / 1000.0, self.started_millis)
            )
        with self._lock:
            if nonce in self._seen:
                raise Replayed("replayed call: %s %s was accepted before; want a new nonce for every call" % (NONCE_HEADER, nonce))
            while self._expiry and self._expiry[0][0] < now:
                until, old = heapq.heappop(self._expiry)
                if self._seen.get(old) == until:
                    del self._seen[old]
            if len(self._seen) >= self._max:
                raise Busy("too many calls to remember: %d calls in the last 60s" % self._max)
            until = at + MAX_CLOCK_SKEW
            self._seen[nonce] = until
            heapq.heappush(self._expiry, (until, nonce))

    def remembered(self) -> int:
        """How many nonces are remembered now."""
        with self._lock:
            return len(self._seen)
