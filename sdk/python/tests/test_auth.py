"""Signed calls: the protocol's test vector and the Verifier's refusals (docs/protocol.md, "Signed calls")."""

from __future__ import annotations

import pytest

from conftest import TOKEN
from handoff.protocol import (
    BadSignature,
    Busy,
    ClockSkew,
    Replayed,
    Unsigned,
    Verifier,
    body_digest,
    sign,
    signature,
)

NOW = 1767225600.0
BODY = b'{"lease":"orders","leader":false,"sequence":1}'
TARGET = "/handoff/v1/leases/orders"


def test_signature_vector() -> None:
    # docs/protocol.md: Python's hmac and Go's crypto/hmac agree.
    sig = signature(TOKEN, "PUT", TARGET, "1767225600000", "0123456789abcdef0123456789abcdef", body_digest(BODY))
    assert sig == "a0f1c8d2ed8f4e07198cb8d99f3dab235a5951df319652a0efa706b242fa2a7e"


def test_body_digest_of_no_bytes() -> None:
    assert body_digest(b"") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def verifier(now: float = NOW, max_nonces: int = 1 << 16) -> Verifier:
    """A Verifier that started an hour before ``now`` (test_before_start.py: one that started since)."""
    clock = [now - 3600]
    v = Verifier(TOKEN, now=lambda: clock[0], max_nonces=max_nonces)
    clock[0] = now
    return v


def test_signed_call_accepted_once() -> None:
    v = verifier()
    h = sign(TOKEN, "PUT", TARGET, BODY, now=NOW)
    v.verify("PUT", TARGET, h, BODY)
    with pytest.raises(Replayed):
        v.verify("PUT", TARGET, h, BODY)
    # A retry is a new call: signed anew, accepted.
    v.verify("PUT", TARGET, sign(TOKEN, "PUT", TARGET, BODY, now=NOW), BODY)


@pytest.mark.parametrize(
    "authz",
    ["", "Bearer " + TOKEN, "Basic " + TOKEN, "HANDOFF-HMAC-SHA256", "HANDOFF-HMAC-SHA256 abc"],
)
def test_unsigned_refused(authz: str) -> None:
    h = sign(TOKEN, "GET", "/handoff/v1/drain", now=NOW)
    if authz:
        h["Authorization"] = authz
    else:
        del h["Authorization"]
    with pytest.raises(Unsigned):
        verifier().verify("GET", "/handoff/v1/drain", h, b"")


@pytest.mark.parametrize("ts", ["", "-1", "1.5", "1234567890123456", "abc"])
def test_malformed_timestamp_refused(ts: str) -> None:
    h = sign(TOKEN, "GET", "/x", now=NOW)
    h["Handoff-Timestamp"] = ts
    with pytest.raises(Unsigned):
        verifier().verify("GET", "/x", h, b"")


@pytest.mark.parametrize("nonce", ["", "short", "x" * 65, "0123456789abcdef!", "0123456789abcdé0"])
def test_malformed_nonce_refused(nonce: str) -> None:
    h = sign(TOKEN, "GET", "/x", now=NOW)
    h["Handoff-Nonce"] = nonce
    with pytest.raises(Unsigned):
        verifier().verify("GET", "/x", h, b"")


def test_scheme_read_in_any_case() -> None:
    v = verifier()
    for scheme in ("handoff-hmac-sha256", "Handoff-Hmac-Sha256"):
        h = sign(TOKEN, "GET", "/x", now=NOW)
        h["Authorization"] = scheme + " " + h["Authorization"].split(" ", 1)[1]
        v.verify("GET", "/x", h, b"")


def test_uppercase_signature_accepted() -> None:
    h = sign(TOKEN, "GET", "/x", now=NOW)
    h["Authorization"] = "HANDOFF-HMAC-SHA256 " + h["Authorization"].split(" ", 1)[1].upper()
    verifier().verify("GET", "/x", h, b"")


@pytest.mark.parametrize(
    "what",
    ["token", "method", "target", "query", "timestamp", "nonce", "body"],
)
def test_altered_call_refused(what: str) -> None:
    h = sign("f" * 64 if what == "token" else TOKEN, "PUT", TARGET, BODY, now=NOW)
    method, target, body = "PUT", TARGET, BODY
    if what == "method":
        method = "POST"
    elif what == "target":
        target = "/handoff/v1/leases/other"
    elif what == "query":
        target = TARGET + "?x=1"
    elif what == "timestamp":
        h["Handoff-Timestamp"] = str(int(NOW * 1000) - 1000)
    elif what == "nonce":
        h["Handoff-Nonce"] = "f" * 32
    elif what == "body":
        body = b'{"other": true}'
    v = verifier()
    with pytest.raises(BadSignature):
        v.verify(method, target, h, body)
    assert v.remembered() == 0, "a refused call's nonce must not be remembered"


@pytest.mark.parametrize("off", [-31.0, 31.0])
def test_timestamp_beyond_30s_refused(off: float) -> None:
    h = sign(TOKEN, "GET", "/x", now=NOW + off)
    with pytest.raises(ClockSkew):
        verifier().verify("GET", "/x", h, b"")


@pytest.mark.parametrize("off", [-29.9, 29.9])
def test_timestamp_within_30s_accepted(off: float) -> None:
    verifier().verify("GET", "/x", sign(TOKEN, "GET", "/x", now=NOW + off), b"")


def test_lowercase_header_names_read() -> None:
    h = {k.lower(): v for k, v in sign(TOKEN, "GET", "/x", now=NOW).items()}
    verifier().verify("GET", "/x", h, b"")


def test_nonce_memory_full_is_busy_until_one_expires() -> None:
    now = [NOW]
    v = Verifier(TOKEN, now=lambda: now[0], max_nonces=3)
    for _ in range(3):
        v.verify("GET", "/x", sign(TOKEN, "GET", "/x", now=now[0]), b"")
    with pytest.raises(Busy) as e:
        v.verify("GET", "/x", sign(TOKEN, "GET", "/x", now=now[0]), b"")
    assert e.value.status == 503
    # Past 30 s the first nonces' timestamps are refused anyway: forgotten, room again.
    now[0] += 30.5
    v.verify("GET", "/x", sign(TOKEN, "GET", "/x", now=now[0]), b"")
    assert v.remembered() == 1


def test_default_nonce_bound_is_65536() -> None:
    from handoff.protocol import MAX_NONCES

    assert MAX_NONCES == 65536
