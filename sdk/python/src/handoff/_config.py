"""The pod's token, the lease duration and the shard set, from the environment the injector sets."""

from __future__ import annotations

import os
import re
from typing import List, Optional

__all__ = [
    "TOKEN_FILE_ENV",
    "TOKEN_FILE",
    "LEASE_DURATION_ENV",
    "SHARDS_ENV",
    "MAX_LEASE_DURATION",
    "MAX_SEQUENCE_AHEAD_NS",
    "MIN_TOKEN_LENGTH",
    "ConfigError",
    "check_token",
    "read_token_file",
    "parse_go_duration",
    "shards_from_env",
]

TOKEN_FILE_ENV = "HANDOFF_TOKEN_FILE"
TOKEN_FILE = "/handoff-bin/token"
LEASE_DURATION_ENV = "HANDOFF_LEASE_DURATION"
SHARDS_ENV = "HANDOFF_SHARDS"
#: The longest lease duration the sidecar accepts, in seconds (1h): the bound of a grant without HANDOFF_LEASE_DURATION.
MAX_LEASE_DURATION = 3600.0
#: How far a Leadership sequence may be ahead of the app's clock, in nanoseconds (1 s).
MAX_SEQUENCE_AHEAD_NS = 1_000_000_000
MIN_TOKEN_LENGTH = 32


class ConfigError(ValueError):
    """The Agent cannot start: no token, an unreadable or bad token file, a bad lease duration or address."""


def check_token(tok: str) -> None:
    """Raise :class:`ConfigError` unless ``tok`` is at least 32 printable ASCII characters, none a space."""
    if len(tok) < MIN_TOKEN_LENGTH:
        raise ConfigError(
            "no usable token: %d bytes; want at least %d printable ASCII characters (handoff install writes 64 hex digits)"
            % (len(tok.encode("utf-8", "surrogateescape")), MIN_TOKEN_LENGTH)
        )
    for i, c in enumerate(tok):
        if not ("!" <= c <= "~"):
            raise ConfigError("no usable token: byte %d is not printable ASCII; want printable ASCII characters and no space" % i)


def read_token_file(path: str) -> str:
    """The token in the file at ``path``: its content with surrounding white space removed (:func:`check_token`)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise ConfigError("token file %s: %s" % (path, e)) from e
    tok = raw.decode("utf-8", "surrogateescape").strip()
    try:
        check_token(tok)
    except ConfigError as e:
        raise ConfigError("token file %s: %s" % (path, e)) from None
    return tok


_UNITS = {"ns": 1e-9, "us": 1e-6, "\u00b5s": 1e-6, "\u03bcs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"([0-9]*(?:\.[0-9]*)?)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")


def parse_go_duration(s: str) -> float:
    """Read a Go duration (``15s``, ``1m30s``, ``500ms``, ``1.5h``) as seconds; raise ValueError if it is not one."""
    rest = s
    sign = 1.0
    if rest[:1] in "+-" and rest:
        sign = -1.0 if rest[0] == "-" else 1.0
        rest = rest[1:]
    if rest == "0":
        return 0.0
    if not rest:
        raise ValueError("time: invalid duration %r" % s)
    total = 0.0
    while rest:
        m = _PART.match(rest)
        if not m or m.group(1) in ("", "."):
            raise ValueError("time: invalid duration %r" % s)
        total += float(m.group(1)) * _UNITS[m.group(2)]
        rest = rest[m.end() :]
    return sign * total


def lease_duration(override: Optional[float] = None) -> float:
    """The longest grant the app accepts, in seconds: ``override``, else $HANDOFF_LEASE_DURATION, else 1h."""
    if override is not None:
        if override <= 0:
            raise ConfigError("lease_duration %r: want a duration above 0 seconds, or None for %s" % (override, LEASE_DURATION_ENV))
        return float(override)
    v = os.environ.get(LEASE_DURATION_ENV, "")
    if v == "":
        return MAX_LEASE_DURATION
    try:
        d = parse_go_duration(v)
    except ValueError:
        d = -1.0
    if d <= 0 or d > MAX_LEASE_DURATION:
        raise ConfigError(
            "environment variable %s %r: want the sidecar's lease duration, a duration above 0 and at most 1h0m0s, like 15s" % (LEASE_DURATION_ENV, v)
        )
    return d


def agent_token(token: Optional[str], token_file: Optional[str], insecure_no_token: bool) -> Optional[str]:
    """The token an Agent checks calls with: ``token``, else the file ``token_file``, else the file $HANDOFF_TOKEN_FILE names.

    None only with ``insecure_no_token`` and no token configured anywhere.
    """
    if token:
        try:
            check_token(token)
        except ConfigError as e:
            raise ConfigError("handoff: token: %s" % e) from None
        return token
    path = token_file or os.environ.get(TOKEN_FILE_ENV, "")
    if path:
        try:
            return read_token_file(path)
        except ConfigError as e:
            raise ConfigError("handoff: the pod's token (token_file or %s): %s" % (TOKEN_FILE_ENV, e)) from None
    if insecure_no_token:
        return None
    raise ConfigError(
        "handoff: no token configured: set the environment variable %s to the pod's token file (the handoff injector sets it to %s), "
        "or pass token_file= or token=; insecure_no_token=True serves without one, for local development only" % (TOKEN_FILE_ENV, TOKEN_FILE)
    )


def shards_from_env() -> List[str]:
    """The pod's shard set: the Lease names in $HANDOFF_SHARDS (comma-separated); none when unset or empty."""
    return [n.strip() for n in os.environ.get(SHARDS_ENV, "").split(",") if n.strip()]
