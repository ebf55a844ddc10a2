#!/usr/bin/env python3
"""An example Celery worker with handoff (handoff.celery): idempotent tasks, hand-back at shutdown, fenced leader work.

    CELERY_BROKER_URL=amqp://guest:guest@127.0.0.1:5672// LEDGER_URL=redis://127.0.0.1:6379/0 \\
    HANDOFF_TOKEN_FILE=token HANDOFF_APP_URL=unix:///tmp/w/app.sock \\
        python3 celery_worker.py worker --pool prefork --concurrency 4 --loglevel INFO

Every argument goes to ``celery`` (``worker`` and its options). The broker
is RabbitMQ or Redis (``$CELERY_BROKER_URL``); the ledger, where tasks apply
their effect and the leader writes, is Redis (``$LEDGER_URL``).

- ``handoff_example.work(key, amount, seconds)`` works for ``seconds``, then
  applies its effect once per ``key``: a Lua script adds ``amount`` to the
  total only if it is the first to set ``applied:{key}`` (a dedup key, as a
  database's unique key would be). With ``task_acks_late`` a task still
  running at the drain deadline goes back to the queue while it runs here:
  the copy that finishes second finds the key and applies nothing.
- While this worker leads the Lease ``handoff-example-report``, it writes a
  report every second, fenced: the write is refused if a holder with a
  newer fencing token has written.
- Each step is logged to the ledger list ``events`` (JSON), for the test
  that checks a handover (tests/test_celery_handover.py).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from typing import Any, Dict, Sequence

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

import redis  # noqa: E402
from celery import Celery  # noqa: E402

import handoff  # noqa: E402
import handoff.celery  # noqa: E402

NAME = os.environ.get("WORKER_NAME") or socket.gethostname()
REPORT_LEASE = "handoff-example-report"

app = Celery("handoff_example", broker=os.environ.get("CELERY_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//"))
app.conf.update(
    task_default_queue="handoff-example",
    # The message of a running task stays unacknowledged until the task is
    # over, so the drain deadline can hand it back; a pool process that
    # dies hands it back too.
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=int(os.environ.get("PREFETCH_MULTIPLIER", "4")),
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)

_ledgers: Dict[int, Any] = {}
_ledger_mu = threading.Lock()


def ledger() -> Any:
    """The Redis ledger (a redis.Redis), one client per process: prefork's children make their own."""
    with _ledger_mu:
        r = _ledgers.get(os.getpid())
        if r is None:
            r = _ledgers[os.getpid()] = redis.Redis.from_url(os.environ.get("LEDGER_URL", "redis://127.0.0.1:6379/0"))
        return r


def event(kind: str, **fields: Any) -> None:
    fields.update(event=kind, worker=NAME, t=time.time())
    ledger().rpush("events", json.dumps(fields))


def on_hand_back(why: str, task_ids: Sequence[str], at: float) -> None:
    """handoff.celery calls this once the messages are back on the broker (sent from ``at`` on)."""
    r = ledger()
    for tid in task_ids:
        r.rpush("events", json.dumps({"event": "handed-back", "why": why, "task_id": tid, "worker": NAME, "t": at}))


integration = handoff.celery.install(app, on_hand_back=on_hand_back)

# The effect, applied once per key: the dedup key and the effect in one step.
APPLY = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX') then
  redis.call('INCRBY', KEYS[2], ARGV[2])
  return 1
end
return 0
"""


@app.task(name="handoff_example.work", bind=True)  # type: ignore[misc]  # Celery is untyped
def work(self: Any, key: str, amount: int, seconds: float) -> str:
    event("start", key=key, task_id=self.request.id)
    time.sleep(seconds)
    r = ledger()
    applied = r.eval(APPLY, 2, "applied:" + key, "total", NAME, str(amount))
    outcome = "applied" if applied else "duplicate"
    r.hincrby("runs", key, 1)  # every run to its end, applied or not
    event(outcome, key=key, task_id=self.request.id)
    return outcome


# Fenced: refused once a newer holder (a greater fencing token) has written.
FENCED_SET = """
local fence = tonumber(redis.call('GET', KEYS[1]) or '-1')
if tonumber(ARGV[1]) < fence then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[2])
return 1
"""


@integration.periodic(REPORT_LEASE, every=1.0)
def report(work: handoff.LeaderWork) -> None:
    r = ledger()
    body = json.dumps({"by": NAME, "fencingToken": work.fencing_token, "t": time.time()})
    ok = r.eval(FENCED_SET, 2, "report:fence", "report:last", str(work.fencing_token), body)
    event("report" if ok else "report-refused", fencing_token=work.fencing_token)


if __name__ == "__main__":
    app.start(sys.argv[1:])
