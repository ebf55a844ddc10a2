"""A receiver refuses a call signed before it started (docs/protocol.md, "Signed calls")."""

from __future__ import annotations

from typing import List

import pytest

from conftest import TOKEN
from handoff.protocol import BeforeStart, ClockSkew, Verifier, sign

START = 1767225600.5
TARGET = "/handoff/v1/stop-claiming"


def started_15s_ago() -> Verifier:
    clock: List[float] = [START]
    v = Verifier(TOKEN, now=lambda: clock[0])
    clock[0] = START + 15
    return v


@pytest.mark.parametrize("at", [START - 15, START - 0.001])
def test_call_signed_before_the_start_refused(at: float) -> None:
    # Within the 30 s skew, a nonce never seen: a call captured before a
    # restart and replayed after it.
    with pytest.raises(BeforeStart) as e:
        started_15s_ago().verify("POST", TARGET, sign(TOKEN, "POST", TARGET, b"{}", now=at), b"{}")
    assert e.value.status == 401
    assert "signed before this receiver started" in str(e.value)


def test_call_past_the_skew_is_refused_for_that() -> None:
    with pytest.raises(ClockSkew):
        started_15s_ago().verify("POST", TARGET, sign(TOKEN, "POST", TARGET, b"{}", now=START - 60), b"{}")


@pytest.mark.parametrize("at", [START, START + 0.0009, START + 1])
def test_call_signed_at_or_after_the_start_accepted(at: float) -> None:
    started_15s_ago().verify("POST", TARGET, sign(TOKEN, "POST", TARGET, b"{}", now=at), b"{}")
