"""HTTP/1.1 framing and the app API's routes, shared by the threaded and the asyncio server.

The servers read a request head and body; :func:`dispatch` checks the
signature and answers at once (a :class:`Response`) or says what to wait
for first (:class:`DrainWait`, :class:`ReturnCall`, :class:`RevokeWait`),
which the server does in its own way, threads or asyncio.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple, Union
from urllib.parse import unquote, unquote_plus

from ._auth import AUTH_SCHEME, AuthError, Verifier
from ._core import Core, Signal, _TermState
from ._wire import MAX_BODY_BYTES, BodyError, DrainStatus, ErrorBody, Leadership, LeadershipAck, ReturnRequest, ReturnResult, encode, parse_body

__all__ = ["HTTPError", "Head", "parse_head", "body_framing", "Response", "dispatch", "MAX_HEADER_BYTES", "MAX_DRAIN_WAIT"]

#: The largest request head read: the sidecar's are under 1 KiB.
MAX_HEADER_BYTES = 8 << 10
#: The longest one drain long poll waits, in seconds.
MAX_DRAIN_WAIT = 30.0
#: Connections a server holds at once; more wait to be accepted.
MAX_CONNS = 64
#: Seconds a client has to send its request head and body.
READ_TIMEOUT = 5.0
#: Seconds a client has to read an answer.
WRITE_TIMEOUT = 10.0
#: Seconds an idle kept-alive connection is kept.
IDLE_TIMEOUT = 90.0

STOP_CLAIMING_PATH = "/handoff/v1/stop-claiming"
DRAIN_PATH = "/handoff/v1/drain"
RETURN_PATH = "/handoff/v1/return"
LEASE_PATH_PREFIX = "/handoff/v1/leases/"

_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    411: "Length Required",
    413: "Request Entity Too Large",
    422: "Unprocessable Entity",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
    505: "HTTP Version Not Supported",
}
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


class HTTPError(Exception):
    """A request that cannot be read: answered ``status`` with ``{"error": ...}`` and the connection closed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Head:
    """A request line and headers. Names are lowercased; the first of repeated headers counts."""

    method: str
    target: str
    version: str
    headers: Dict[str, str]
    keep_alive: bool


def parse_head(data: bytes) -> Head:
    """Read a request head (up to its blank line; CRLF or LF line ends). Raises :class:`HTTPError`."""
    lines = data.split(b"\n")
    lines = [ln[:-1] if ln.endswith(b"\r") else ln for ln in lines]
    while lines and lines[-1] == b"":
        lines.pop()
    if not lines:
        raise HTTPError(400, "malformed HTTP request: empty")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or not parts[1]:
        raise HTTPError(400, "malformed HTTP request line")
    version = parts[2].decode("latin-1")
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise HTTPError(505, "unsupported protocol version %r; want HTTP/1.1" % version[:16])
    headers: Dict[str, str] = {}
    for ln in lines[1:]:
        name, sep, value = ln.partition(b":")
        if not sep or not _TOKEN.fullmatch(name):
            raise HTTPError(400, "malformed MIME header line")
        key = name.decode("latin-1").lower()
        v = value.strip(b" \t").decode("latin-1")
        if key == "content-length" and key in headers and headers[key] != v:
            raise HTTPError(400, "repeated Content-Length headers with different values")
        headers.setdefault(key, v)
    conn = headers.get("connection", "").lower()
    keep = "close" not in conn if version == "HTTP/1.1" else "keep-alive" in conn
    return Head(parts[0].decode("latin-1"), parts[1].decode("latin-1"), version, headers, keep)


def body_framing(h: Head) -> Tuple[str, int]:
    """How the body is framed: ("length", n) or ("chunked", 0). Raises :class:`HTTPError`."""
    te = h.headers.get("transfer-encoding")
    if te is not None:
        if te.lower() != "chunked":
            raise HTTPError(501, "unsupported transfer encoding %r" % te[:32])
        return "chunked", 0
    cl = h.headers.get("content-length")
    if cl is None:
        return "length", 0
    if not cl.isdigit() or not cl.isascii():
        raise HTTPError(400, "bad Content-Length %r" % cl[:32])
    return "length", int(cl)


def wants_continue(h: Head, kind: str, n: int) -> bool:
    """Whether to answer ``100 Continue`` before reading the body (``Expect: 100-continue``, a body within the limit)."""
    return h.headers.get("expect", "").lower() == "100-continue" and h.version == "HTTP/1.1" and (kind == "chunked" or 0 < n <= MAX_BODY_BYTES)


CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


def parse_chunk_size(line: bytes) -> int:
    size = line.split(b";", 1)[0].strip()
    if not size or not re.fullmatch(rb"[0-9A-Fa-f]{1,16}", size):
        raise HTTPError(400, "malformed chunked encoding")
    return int(size, 16)


@dataclass
class Response:
    """One answer, written in one piece by :meth:`render`."""

    status: int
    body: bytes
    headers: List[Tuple[str, str]] = field(default_factory=list)
    close: bool = False

    def render(self) -> bytes:
        """Status line, headers (with Content-Length) and body, as the bytes of one write."""
        head = ["HTTP/1.1 %d %s" % (self.status, _REASONS.get(self.status, "Status")), "Content-Type: application/json"]
        head.append("Content-Length: %d" % len(self.body))
        head.extend("%s: %s" % kv for kv in self.headers)
        if self.close:
            head.append("Connection: close")
        return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + self.body


def json_response(status: int, msg: Any, headers: Optional[List[Tuple[str, str]]] = None, close: bool = False) -> Response:
    return Response(status, encode(msg), headers or [], close)


def error_response(status: int, message: str, headers: Optional[List[Tuple[str, str]]] = None, close: bool = False) -> Response:
    return json_response(status, ErrorBody(message), headers, close)


def refuse(err: AuthError) -> Response:
    """A call the Verifier refused: 401 with the challenge, or 503 with Retry-After for a full nonce memory."""
    msg = "%s (the pod's token is the file named by HANDOFF_TOKEN_FILE)" % err
    if err.status == 503:
        return error_response(503, msg, [("Retry-After", "1")])
    return error_response(401, msg, [("WWW-Authenticate", AUTH_SCHEME + ' realm="handoff"')])


def too_large() -> Response:
    return error_response(
        413, "body: larger than %d bytes; want at most %d bytes (64 KiB) of JSON" % (MAX_BODY_BYTES, MAX_BODY_BYTES), close=True
    )


@dataclass
class DrainWait:
    """Answer the drain status once drained or after ``seconds``."""

    seconds: float


@dataclass
class ReturnCall:
    """Run the return fallback, then answer its ReturnResult."""

    cancel: bool
    cancel_wait: float


@dataclass
class RevokeWait:
    """Answer the revoke's ack once the leader work of every one of ``terms`` (the Lease's) is done."""

    lease: str
    terms: List[_TermState[Any]]


Action = Union[Response, DrainWait, ReturnCall, RevokeWait]


def _go_quote(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


_WHOLE = re.compile(r"[+-]?[0-9]+")
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def wait_param(query: str) -> float:
    """The drain long poll's ``waitMillis`` in seconds: absent or empty 0, above 30000 (any size) 30 s; raises ValueError."""
    values: List[str] = []
    for pair in query.split("&") if query else []:
        if not pair or ";" in pair:
            continue  # Go's ParseQuery skips a pair with a semicolon
        k, _, v = pair.partition("=")
        if _BAD_ESCAPE.search(k) or _BAD_ESCAPE.search(v):
            continue  # and one with a bad escape
        if unquote_plus(k) == "waitMillis":
            values.append(unquote_plus(v))
    if len(values) > 1:
        raise ValueError("waitMillis given %d times; want it once" % len(values))
    if not values or values[0].strip() == "":
        return 0.0
    v = values[0].strip()
    if not _WHOLE.fullmatch(v):
        raise ValueError("waitMillis %s: want a whole number of milliseconds, 0 or more" % _go_quote(values[0]))
    ms = int(v)
    if ms < 0:
        raise ValueError("waitMillis %s: want a whole number of milliseconds, 0 or more" % _go_quote(values[0]))
    return min(ms / 1000.0, MAX_DRAIN_WAIT)


def _route(target: str) -> Tuple[str, str, Optional[str]]:
    """(route, query, lease) of a request target; route "" for a path the protocol does not define."""
    path, _, query = target.partition("?")
    if path.startswith("http://") or path.startswith("https://"):
        rest = path.split("://", 1)[1]
        slash = rest.find("/")
        path = rest[slash:] if slash >= 0 else "/"
    if path in (STOP_CLAIMING_PATH, DRAIN_PATH, RETURN_PATH):
        return path, query, None
    if path.startswith(LEASE_PATH_PREFIX):
        seg = path[len(LEASE_PATH_PREFIX) :]
        if seg and "/" not in seg:
            return LEASE_PATH_PREFIX, query, unquote(seg)
    return "", query, None


_METHODS = {STOP_CLAIMING_PATH: "POST", DRAIN_PATH: "GET", RETURN_PATH: "POST", LEASE_PATH_PREFIX: "PUT"}


def dispatch(core: Core[Any], verifier: Optional[Verifier], head: Head, body: bytes) -> Action:
    """Check one call's signature and route it: an answer now, or what to wait for before answering."""
    if verifier is not None:
        try:
            verifier.verify(head.method, head.target, head.headers, body)
        except AuthError as e:
            return refuse(e)
    route, query, lease = _route(head.target)
    if not route:
        return error_response(404, "404 page not found: %s is not a path of the handoff app API" % head.target.partition("?")[0][:200])
    want = _METHODS[route]
    if head.method != want:
        return error_response(405, "method %s not allowed; use %s" % (head.method[:16], want), [("Allow", want)])
    if route == STOP_CLAIMING_PATH:
        return json_response(200, core.stop_claiming())
    if route == DRAIN_PATH:
        try:
            return DrainWait(wait_param(query))
        except ValueError as e:
            return error_response(400, str(e))
    if route == RETURN_PATH:
        try:
            req = ReturnRequest.from_json(parse_body(body))
        except BodyError as e:
            return error_response(e.status, str(e))
        return ReturnCall(req.cancel, req.cancel_wait_millis / 1000.0)
    assert lease is not None
    return _leadership(core, lease, body)


def _leadership(core: Core[Any], lease: str, body: bytes) -> Action:
    clock = core._clock
    received_mono = clock.monotonic()
    received_wall_ns = int(clock.time() * 1e9)
    try:
        msg = Leadership.from_json(parse_body(body))
    except BodyError as e:
        return error_response(e.status, str(e))
    if msg.lease and msg.lease != lease:
        return error_response(
            400, "body: lease %s differs from the path's Lease %s; want the same name, or leave it out" % (_go_quote(msg.lease), _go_quote(lease))
        )
    why = core._genuine(msg.leader, msg.sequence, msg.valid_for_millis, msg.until, received_wall_ns)
    if why is not None:
        return error_response(422, why)
    grant: Optional[Tuple[int, float]] = None
    if msg.leader:
        until = received_mono + max(msg.valid_for_millis, 0) / 1000.0
        if msg.until is not None:
            until = min(until, received_mono + (msg.until - received_wall_ns) / 1e9)
        grant = (msg.fencing_token, until)
    stale, terms = core._apply_leadership(lease, msg.sequence, grant)
    if stale:
        return json_response(200, LeadershipAck(leader=msg.leader, stale=True))
    if msg.leader:
        return json_response(200, LeadershipAck(leader=True))
    return RevokeWait(lease, terms)


def drain_answer(st: DrainStatus) -> Response:
    return json_response(200, st)


def return_answer(res: ReturnResult) -> Response:
    return json_response(200, res)


def revoke_answer() -> Response:
    return json_response(200, LeadershipAck(leader=False))


def signal_is_set(s: Signal) -> bool:
    return s.is_set()
