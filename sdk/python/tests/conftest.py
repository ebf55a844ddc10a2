from __future__ import annotations

import os
import shutil
import sys
import tempfile
from typing import Iterator

import pytest

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
if SRC not in sys.path:
    sys.path.insert(0, SRC)

TOKEN = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"


@pytest.fixture
def sockdir() -> Iterator[str]:
    """A short directory for sockets (a socket path has at most 107 bytes)."""
    d = tempfile.mkdtemp(prefix="hpy", dir="/tmp")
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("HANDOFF_TOKEN_FILE", "HANDOFF_APP_URL", "HANDOFF_LEASE_DURATION", "HANDOFF_SHARDS"):
        monkeypatch.delenv(k, raising=False)


@pytest.fixture(scope="session")
def celery_servers() -> Iterator[object]:
    """Redis and RabbitMQ for the Celery tests (tests/celeryrig.py), started once and stopped at the end."""
    import celeryrig

    why = celeryrig.missing()
    if why:
        pytest.skip(why)
    d = tempfile.mkdtemp(prefix="hcel", dir="/tmp")
    s = celeryrig.Servers(d)
    try:
        yield s
    finally:
        s.stop()
        shutil.rmtree(d, ignore_errors=True)
