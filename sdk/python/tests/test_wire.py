"""The wire messages: bodies read as package worker reads them, answers written as it writes them."""

from __future__ import annotations

import json

import pytest

from handoff.protocol import (
    MAX_BODY_BYTES,
    BodyError,
    DrainStatus,
    Leadership,
    LeadershipAck,
    ReturnRequest,
    ReturnResult,
    format_rfc3339,
    parse_body,
    parse_rfc3339,
)
from handoff._wire import encode


@pytest.mark.parametrize(
    "body,status",
    [
        (b"", 400),
        (b"  \n", 400),
        (b"{", 400),
        (b"[]", 400),
        (b"null", 400),
        (b'"cancel"', 400),
        (b'{"cancel": false} {"cancel": true}', 400),
        (b'{"cancel": false}garbage', 400),
        (b'{"a": NaN}', 400),
        (b"\xff{}", 400),
        (b'{"pad": "' + b"x" * MAX_BODY_BYTES + b'"}', 413),
    ],
)
def test_bad_bodies(body: bytes, status: int) -> None:
    with pytest.raises(BodyError) as e:
        parse_body(body)
    assert e.value.status == status


def test_body_white_space_around_the_object() -> None:
    assert parse_body(b' \r\n\t{"cancel": true}\n ') == {"cancel": True}


def test_body_at_the_limit_is_read() -> None:
    body = b'{"pad": "' + b"x" * (MAX_BODY_BYTES - 11) + b'"}'
    assert len(body) == MAX_BODY_BYTES
    parse_body(body)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"cancel": "yes"}',
        b'{"cancel": 1}',
        b'{"cancelWaitMillis": "5"}',
        b'{"cancelWaitMillis": 1.5}',
        b'{"cancelWaitMillis": 1e3}',
        b'{"cancelWaitMillis": 1.0}',
        b'{"cancelWaitMillis": -1}',
        b'{"cancelWaitMillis": 9223372036854775808}',
    ],
)
def test_bad_return_requests(raw: bytes) -> None:
    with pytest.raises(BodyError) as e:
        ReturnRequest.from_json(parse_body(raw))
    assert e.value.status == 400


def test_return_request_zero_values_and_unknown_fields() -> None:
    assert ReturnRequest.from_json(parse_body(b'{"future": [1, 2], "cancel": null}')) == ReturnRequest(False, 0)
    assert ReturnRequest.from_json(parse_body(b'{"cancel": true, "cancelWaitMillis": 9223372036854775807}')).cancel_wait_millis == (1 << 63) - 1


def test_leadership_fields() -> None:
    msg = Leadership.from_json(
        parse_body(
            b'{"lease":"nightly-report","leader":true,"sequence":1764547200000000000,"holderIdentity":"pod_uid",'
            b'"fencingToken":3,"until":"2025-01-02T15:04:15.123Z","validForMillis":9987,"newField":{}}'
        )
    )
    assert msg == Leadership("nightly-report", True, 1764547200000000000, "pod_uid", 3, 1735830255123000000, 9987)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"leader": "yes"}',
        b'{"sequence": "12"}',
        b'{"sequence": 1.5}',
        b'{"sequence": 12e3}',
        b'{"sequence": 9223372036854775808}',
        b'{"fencingToken": true}',
        b'{"leader": true, "until": "tomorrow"}',
        b'{"leader": true, "until": ""}',
        b'{"leader": true, "until": 5}',
        b'{"lease": 5}',
    ],
)
def test_bad_leadership(raw: bytes) -> None:
    with pytest.raises(BodyError) as e:
        Leadership.from_json(parse_body(raw))
    assert e.value.status == 400


@pytest.mark.parametrize(
    "s,ns",
    [
        ("1970-01-01T00:00:00Z", 0),
        ("2025-01-02T15:04:05.123456789Z", 1735830245123456789),
        ("2025-01-02T15:04:05.1234567891Z", 1735830245123456789),
        ("2025-01-02T16:04:05+01:00", 1735830245000000000),
        ("2025-01-02T14:04:05.5-01:00", 1735830245500000000),
        ("2024-02-29T00:00:00Z", 1709164800000000000),
        ("1969-12-31T23:59:59Z", -1000000000),
    ],
)
def test_rfc3339(s: str, ns: int) -> None:
    assert parse_rfc3339(s) == ns


@pytest.mark.parametrize(
    "s",
    ["2025-13-01T00:00:00Z", "2025-02-29T00:00:00Z", "2025-01-01T24:00:00Z", "2025-01-01T00:00:60Z", "2025-01-01 00:00:00Z",
     "2025-01-01T00:00:00", "2025-01-01T00:00:00+0100", "2025-01-01T00:00:00.Z"],
)
def test_bad_rfc3339(s: str) -> None:
    with pytest.raises(ValueError):
        parse_rfc3339(s)


def test_format_rfc3339_as_go() -> None:
    assert format_rfc3339(1735830245123456789) == "2025-01-02T15:04:05.123456789Z"
    assert format_rfc3339(1735830245120000000) == "2025-01-02T15:04:05.12Z"
    assert format_rfc3339(1735830245000000000) == "2025-01-02T15:04:05Z"
    assert parse_rfc3339(format_rfc3339(1735830245000000001)) == 1735830245000000001


def test_answers_leave_optional_zero_fields_out() -> None:
    assert encode(DrainStatus(stopping=True, in_flight=0, drained=True)) == b'{"stopping":true,"inFlight":0,"receiving":0,"drained":true}\n'
    full = DrainStatus(True, 3, 1, 2, 1500, False, "abc")
    assert json.loads(encode(full)) == {
        "stopping": True, "inFlight": 3, "unstarted": 1, "receiving": 2, "runningMillis": 1500, "drained": False, "instance": "abc",
    }
    assert DrainStatus.from_json(json.loads(encode(full))) == full
    assert encode(ReturnResult(0)) == b'{"returned":0}\n'
    assert encode(ReturnResult(2, "boom")) == b'{"returned":2,"error":"boom"}\n'
    assert encode(LeadershipAck(False)) == b'{"leader":false}\n'
    assert encode(LeadershipAck(True, True)) == b'{"leader":true,"stale":true}\n'
    assert encode(Leadership("a", False, 1)) == b'{"lease":"a","leader":false,"sequence":1,"fencingToken":0}\n'
