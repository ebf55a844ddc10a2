"""handoff conformance, the repository's suite, against the example workers (threaded and asyncio).

Needs the handoff binary: set HANDOFF_BIN (test.sh builds one). Every case
must pass, none skipped. The fixture is the SDK's own (handoff.testing):
``python3 -m handoff.testing`` is the fixture command, and the workers serve
its steps with ``serve_fixture``/``serve_fixture_async``; so the suite proves
the SDK's side of the fixture contract as well as the workers.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EXAMPLES = os.path.join(ROOT, "examples")
BIN = os.environ.get("HANDOFF_BIN", "")


@pytest.mark.skipif(not BIN, reason="HANDOFF_BIN is not set: build the handoff binary (go build -o /tmp/handoff ./cmd/handoff) and set HANDOFF_BIN to run the conformance suite")
@pytest.mark.parametrize("worker", ["worker.py", "aio_worker.py"])
def test_conformance(sockdir: str, worker: str) -> None:
    with open(os.path.join(sockdir, "token"), "w") as f:
        f.write(os.urandom(32).hex() + "\n")
    url = "unix://%s/app.sock" % sockdir
    env = dict(os.environ)
    env.update(
        HANDOFF_APP_URL=url,
        HANDOFF_TOKEN_FILE=os.path.join(sockdir, "token"),
        PYTHONPATH=os.pathsep.join(p for p in (os.path.join(ROOT, "src"), env.get("PYTHONPATH", "")) if p),
    )
    run_worker = " ".join(shlex.quote(w) for w in (sys.executable, os.path.join(EXAMPLES, worker), "--queue", os.path.join(sockdir, "queue")))
    fixture = " ".join(shlex.quote(w) for w in (sys.executable, "-m", "handoff.testing", "--dir", sockdir, "--worker", run_worker))
    try:
        p = subprocess.run(
            [BIN, "conformance", "--app-url", url, "--token-file", env["HANDOFF_TOKEN_FILE"], "--fixture-cmd", fixture, "--leader-cmd", fixture, "--timeout", "3m"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=240,
        )
    finally:
        subprocess.run(shlex.split(fixture) + ["stop"], env=env, timeout=30)
    out = p.stdout.decode()
    print(out)
    m = re.search(r"(\d+) passed, (\d+) failed, (\d+) skipped", out)
    log = os.path.join(sockdir, "worker.log")
    assert m, "no summary from handoff conformance:\n%s" % out
    passed, failed, skipped = map(int, m.groups())
    if failed or skipped or p.returncode != 0:
        tail = open(log).read()[-4000:] if os.path.exists(log) else ""
        pytest.fail("%s: %d passed, %d failed, %d skipped (exit %d)\n%s\nworker log:\n%s" % (worker, passed, failed, skipped, p.returncode, out, tail))
    assert passed >= 33
