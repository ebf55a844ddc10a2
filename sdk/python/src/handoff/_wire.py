"""The messages of the app API (docs/protocol.yaml, components.schemas).

Each dataclass names its JSON fields in ``JSON_FIELDS`` (the wire name of
each attribute, in order) and ``REQUIRED`` (those sent whatever their value);
the others are left out when zero. ``tests/test_schema.py`` checks both
against ``docs/protocol.yaml``.

Reading follows Go's ``encoding/json`` as package ``worker`` uses it: one
JSON object, unknown fields ignored, an absent field or ``null`` read as its
zero value, a number read into an integer field only if it is a whole
number in decimal within 64 bits, a time only in RFC 3339.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, ClassVar, Dict, Optional, Tuple

__all__ = [
    "MAX_BODY_BYTES",
    "BodyError",
    "DrainStatus",
    "ReturnRequest",
    "ReturnResult",
    "Leadership",
    "LeadershipAck",
    "ErrorBody",
    "parse_body",
    "parse_rfc3339",
    "format_rfc3339",
    "encode",
]

#: The largest request body the app API reads, in bytes (64 KiB); larger: ``413``.
MAX_BODY_BYTES = 64 << 10

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


class BodyError(ValueError):
    """A request body the app refuses: ``status`` (400 or 413) and the message for ``{"error": ...}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Float(str):
    """A JSON number with a fraction or exponent, kept as its text."""


def _no_constant(name: str) -> Any:
    raise ValueError("invalid character %r looking for beginning of value" % name[:1])


_decoder = json.JSONDecoder(parse_float=_Float, parse_constant=_no_constant)
_WS = " \t\r\n"


def _short(raw: str) -> str:
    return raw[:20]


def parse_body(body: bytes) -> Dict[str, Any]:
    """Read a request body: one JSON object, nothing after it but white space.

    Raises :class:`BodyError`: ``413`` for more than 64 KiB, ``400`` for an
    empty body, one that is not JSON, not an object, or followed by more.
    """
    if len(body) > MAX_BODY_BYTES:
        raise BodyError(413, "body: larger than %d bytes; want at most %d bytes (64 KiB) of JSON" % (MAX_BODY_BYTES, MAX_BODY_BYTES))
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise BodyError(400, "body: not UTF-8; want one JSON object") from None
    start = len(text) - len(text.lstrip(_WS))
    if start == len(text):
        raise BodyError(400, "body: empty; want one JSON object")
    try:
        value, end = _decoder.raw_decode(text, start)
    except ValueError as e:
        raise BodyError(400, "body: %s; want one JSON object" % e) from None
    if not isinstance(value, dict):
        raise BodyError(400, "body: %s is not a JSON object; want one JSON object" % _short(text[start:end]))
    if text[end:].strip(_WS):
        raise BodyError(400, "body: data after the JSON value; want one JSON object and nothing after it but white space")
    return value


def _field(obj: Dict[str, Any], name: str, kind: str, go_type: str) -> Any:
    v = obj.get(name)
    if v is None:
        return {"bool": False, "int": 0, "str": "", "time": None}[kind]
    ok = False
    if kind == "bool":
        ok = isinstance(v, bool)
    elif kind == "int":
        ok = isinstance(v, int) and not isinstance(v, bool) and _INT64_MIN <= v <= _INT64_MAX
    elif kind in ("str", "time"):
        ok = isinstance(v, str) and not isinstance(v, _Float)
    if not ok:
        raise BodyError(400, "body: json: cannot unmarshal %s into field %s of type %s; want one JSON object" % (_json_kind(v), name, go_type))
    if kind == "time":
        try:
            return parse_rfc3339(v)
        except ValueError as e:
            raise BodyError(400, "body: %s; want one JSON object" % e) from None
    return v


def _json_kind(v: Any) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, _Float)):
        return "number " + str(v)
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


# RFC 3339 as Go's time.Time reads it: fractional seconds of any length,
# truncated to nanoseconds, and a zone Z or +hh:mm.
_RFC3339 = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(?:(Z)|([+-])(\d{2}):(\d{2}))\Z")


def _days_from_civil(y: int, m: int, d: int) -> int:
    y -= m <= 2
    era = (y if y >= 0 else y - 399) // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def parse_rfc3339(s: str) -> int:
    """Read an RFC 3339 time (up to nanoseconds, ``Z`` or an offset) as Unix nanoseconds."""
    m = _RFC3339.match(s)
    if not m:
        raise ValueError("parsing time %r as RFC 3339: want a time like 2025-01-02T15:04:05.123456789Z" % s[:40])
    year, month, day, hour, minute, sec = (int(m.group(i)) for i in range(1, 7))
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    mdays = [31, 29 if leap else 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
    if not (1 <= month <= 12 and 1 <= day <= mdays[month - 1] and hour < 24 and minute < 60 and sec < 60):
        raise ValueError("parsing time %r as RFC 3339: a field is out of range" % s[:40])
    ns = int((m.group(7) or "")[:9].ljust(9, "0"))
    offset = 0
    if m.group(8) is None:
        oh, om = int(m.group(10)), int(m.group(11))
        if oh >= 24 or om >= 60:
            raise ValueError("parsing time %r as RFC 3339: the zone offset is out of range" % s[:40])
        offset = (oh * 3600 + om * 60) * (1 if m.group(9) == "+" else -1)
    secs = _days_from_civil(year, month, day) * 86400 + hour * 3600 + minute * 60 + sec - offset
    return secs * 1_000_000_000 + ns


def format_rfc3339(unix_ns: int) -> str:
    """Write Unix nanoseconds as Go writes a UTC ``time.Time``: trailing zeros of the fraction dropped."""
    import datetime

    secs, ns = divmod(unix_ns, 1_000_000_000)
    t = datetime.datetime(1970, 1, 1) + datetime.timedelta(seconds=secs)
    frac = ("%09d" % ns).rstrip("0")
    return t.strftime("%Y-%m-%dT%H:%M:%S") + ("." + frac if frac else "") + "Z"


def _dump(obj: Any, fields: Tuple[Tuple[str, str], ...], required: Tuple[str, ...]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for attr, name in fields:
        v = getattr(obj, attr)
        if name in required or v:
            out[name] = format_rfc3339(v) if name == "until" else v
    return out


def encode(msg: Any) -> bytes:
    """One message as the app answers it: compact JSON and a newline."""
    return (json.dumps(msg.to_json(), separators=(",", ":"), ensure_ascii=False) + "\n").encode()


@dataclass(frozen=True)
class DrainStatus:
    """The app's count of work it has claimed and not finished (stop-claiming and drain answer it).

    ``in_flight`` counts the claims held, ``unstarted`` those of them held
    and not started, ``receiving`` the waits for a message pending,
    ``running_millis`` the age in milliseconds of the oldest claim in
    progress (0 with none), ``drained`` is ``in_flight == 0 and receiving
    == 0``, ``instance`` names the process.
    """

    stopping: bool = False
    in_flight: int = 0
    unstarted: int = 0
    receiving: int = 0
    running_millis: int = 0
    drained: bool = False
    instance: str = ""

    JSON_FIELDS: ClassVar[Tuple[Tuple[str, str], ...]] = (
        ("stopping", "stopping"),
        ("in_flight", "inFlight"),
        ("unstarted", "unstarted"),
        ("receiving", "receiving"),
        ("running_millis", "runningMillis"),
        ("drained", "drained"),
        ("instance", "instance"),
    )
    # receiving is sent always, though the schema lets another app leave it out.
    REQUIRED: ClassVar[Tuple[str, ...]] = ("stopping", "inFlight", "drained")
    SENT_ALWAYS: ClassVar[Tuple[str, ...]] = ("stopping", "inFlight", "receiving", "drained")

    def to_json(self) -> Dict[str, Any]:
        return _dump(self, self.JSON_FIELDS, self.SENT_ALWAYS)

    @classmethod
    def from_json(cls, obj: Dict[str, Any]) -> "DrainStatus":
        return cls(
            stopping=_field(obj, "stopping", "bool", "bool"),
            in_flight=_field(obj, "inFlight", "int", "int"),
            unstarted=_field(obj, "unstarted", "int", "int"),
            receiving=_field(obj, "receiving", "int", "int"),
            running_millis=_field(obj, "runningMillis", "int", "int64"),
            drained=_field(obj, "drained", "bool", "bool"),
            instance=_field(obj, "instance", "str", "string"),
        )


@dataclass(frozen=True)
class ReturnRequest:
    """Asks the app to hand back its unfinished claims; with ``cancel``, first cancel in-flight work and wait up to ``cancel_wait_millis``."""

    cancel: bool = False
    cancel_wait_millis: int = 0

    JSON_FIELDS: ClassVar[Tuple[Tuple[str, str], ...]] = (("cancel", "cancel"), ("cancel_wait_millis", "cancelWaitMillis"))
    REQUIRED: ClassVar[Tuple[str, ...]] = ("cancel",)

    def to_json(self) -> Dict[str, Any]:
        return _dump(self, self.JSON_FIELDS, self.REQUIRED)

    @classmethod
    def from_json(cls, obj: Dict[str, Any]) -> "ReturnRequest":
        r = cls(cancel=_field(obj, "cancel", "bool", "bool"), cancel_wait_millis=_field(obj, "cancelWaitMillis", "int", "int64"))
        if r.cancel_wait_millis < 0:
            raise BodyError(400, "body: cancelWaitMillis %d; want a whole number of milliseconds, 0 or more" % r.cancel_wait_millis)
        return r


@dataclass(frozen=True)
class ReturnResult:
    """How many claims the app handed back (``returned``), and why handing back failed (``error``, empty on success)."""

    returned: int = 0
    error: str = ""

    JSON_FIELDS: ClassVar[Tuple[Tuple[str, str], ...]] = (("returned", "returned"), ("error", "error"))
    REQUIRED: ClassVar[Tuple[str, ...]] = ("returned",)

    def to_json(self) -> Dict[str, Any]:
        return _dump(self, self.JSON_FIELDS, self.REQUIRED)

    @classmethod
    def from_json(cls, obj: Dict[str, Any]) -> "ReturnResult":
        return cls(returned=_field(obj, "returned", "int", "int"), error=_field(obj, "error", "str", "string"))


@dataclass(frozen=True)
class Leadership:
    """A grant (``leader``) or a revoke of one Lease, as the sidecar sends it.

    ``sequence`` is the send time in Unix nanoseconds, strictly increasing
    per Lease; ``until`` is Unix nanoseconds (None when absent);
    ``valid_for_millis`` counts from receipt; ``fencing_token`` grows with
    each new holder.
    """

    lease: str = ""
    leader: bool = False
    sequence: int = 0
    holder_identity: str = ""
    fencing_token: int = 0
    until: Optional[int] = None
    valid_for_millis: int = 0

    JSON_FIELDS: ClassVar[Tuple[Tuple[str, str], ...]] = (
        ("lease", "lease"),
        ("leader", "leader"),
        ("sequence", "sequence"),
        ("holder_identity", "holderIdentity"),
        ("fencing_token", "fencingToken"),
        ("until", "until"),
        ("valid_for_millis", "validForMillis"),
    )
    REQUIRED: ClassVar[Tuple[str, ...]] = ("lease", "leader", "sequence", "fencingToken")

    def to_json(self) -> Dict[str, Any]:
        return _dump(self, self.JSON_FIELDS, self.REQUIRED)

    @classmethod
    def from_json(cls, obj: Dict[str, Any]) -> "Leadership":
        return cls(
            lease=_field(obj, "lease", "str", "string"),
            leader=_field(obj, "leader", "bool", "bool"),
            sequence=_field(obj, "sequence", "int", "int64"),
            holder_identity=_field(obj, "holderIdentity", "str", "string"),
            fencing_token=_field(obj, "fencingToken", "int", "int64"),
            until=_field(obj, "until", "time", "time.Time"),
            valid_for_millis=_field(obj, "validForMillis", "int", "int64"),
        )


@dataclass(frozen=True)
class LeadershipAck:
    """The app's answer to a :class:`Leadership`: ``leader`` echoed; ``stale`` when not applied."""

    leader: bool = False
    stale: bool = False

    JSON_FIELDS: ClassVar[Tuple[Tuple[str, str], ...]] = (("leader", "leader"), ("stale", "stale"))
    REQUIRED: ClassVar[Tuple[str, ...]] = ("leader",)

    def to_json(self) -> Dict[str, Any]:
        return _dump(self, self.JSON_FIELDS, self.REQUIRED)

    @classmethod
    def from_json(cls, obj: Dict[str, Any]) -> "LeadershipAck":
        return cls(leader=_field(obj, "leader", "bool", "bool"), stale=_field(obj, "stale", "bool", "bool"))


@dataclass(frozen=True)
class ErrorBody:
    """The body of every error the app API answers: ``{"error": "..."}``."""

    error: str = ""

    JSON_FIELDS: ClassVar[Tuple[Tuple[str, str], ...]] = (("error", "error"),)
    REQUIRED: ClassVar[Tuple[str, ...]] = ("error",)

    def to_json(self) -> Dict[str, Any]:
        return _dump(self, self.JSON_FIELDS, self.REQUIRED)

    @classmethod
    def from_json(cls, obj: Dict[str, Any]) -> "ErrorBody":
        return cls(error=_field(obj, "error", "str", "string"))
