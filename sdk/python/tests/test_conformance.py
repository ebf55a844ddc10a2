"""handoff conformance, the repository's suite, against the example workers (threaded and asyncio).

Needs the handoff binary: set HANDOFF_BIN (test.sh builds one). Every case
must pass, none skipped. The fixture is the SDK's own (handoff.testing):
``python3 -m handoff.testing`` is the fixture command, and the workers serve
its steps with ``serve_fixture``/``serve_fixture_async``; so the suite proves
the SDK's side of the fixture contract as well as the workers.

With HANDOFF_SDK_PYTHON set to the interpreter of an environment the SDK is
installed in (test.sh: a fresh venv holding the built wheel), the workers
and the fixture command run on the installed copy instead of src/: copies of
the examples in a temporary directory, run with ``-I`` (isolated: no
PYTHONPATH, no script directory, no user site), after a check that this
interpreter imports ``handoff`` from inside its own environment.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EXAMPLES = os.path.join(ROOT, "examples")
BIN = os.environ.get("HANDOFF_BIN", "")
INSTALLED = os.environ.get("HANDOFF_SDK_PYTHON", "")


def installed_handoff(python: str) -> str:
    """The path of the handoff package `python -I` imports, after checking it is its environment's, not src/."""
    p = subprocess.run(
        [python, "-I", "-c", "import handoff, handoff.testing, sys; print(sys.prefix); print(sys.base_prefix); print(handoff.__file__)"],
        cwd="/", stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60,
    )
    out = p.stdout.decode()
    assert p.returncode == 0, "HANDOFF_SDK_PYTHON=%s does not import handoff:\n%s" % (python, out)
    prefix, base, path = out.splitlines()[-3:]
    assert prefix != base, "HANDOFF_SDK_PYTHON=%s is not a venv's interpreter (sys.prefix %s)" % (python, prefix)
    assert path.startswith(os.path.join(prefix, "")), "HANDOFF_SDK_PYTHON=%s imports handoff from %s, outside its venv %s" % (python, path, prefix)
    assert not path.startswith(os.path.join(ROOT, "")), "HANDOFF_SDK_PYTHON=%s imports handoff from the source tree: %s" % (python, path)
    return path


@pytest.mark.skipif(not BIN, reason="HANDOFF_BIN is not set: build the handoff binary (go build -o /tmp/handoff ./cmd/handoff) and set HANDOFF_BIN to run the conformance suite")
@pytest.mark.parametrize("worker", ["worker.py", "aio_worker.py"])
def test_conformance(sockdir: str, worker: str) -> None:
    with open(os.path.join(sockdir, "token"), "w") as f:
        f.write(os.urandom(32).hex() + "\n")
    url = "unix://%s/app.sock" % sockdir
    env = dict(os.environ)
    env.update(HANDOFF_APP_URL=url, HANDOFF_TOKEN_FILE=os.path.join(sockdir, "token"))
    if INSTALLED:
        # The installed copy: the examples copied out of the tree, run isolated.
        print("installed handoff:", installed_handoff(INSTALLED))
        app = os.path.join(sockdir, "app")
        os.mkdir(app)
        for name in (worker, "filequeue.py"):
            shutil.copy(os.path.join(EXAMPLES, name), app)
        python, script = [INSTALLED, "-I"], os.path.join(app, worker)
        env.pop("PYTHONPATH", None)
    else:
        python, script = [sys.executable], os.path.join(EXAMPLES, worker)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.join(ROOT, "src"), env.get("PYTHONPATH", "")) if p)
    run_worker = " ".join(shlex.quote(w) for w in python + [script, "--queue", os.path.join(sockdir, "queue")])
    fixture = " ".join(shlex.quote(w) for w in python + ["-m", "handoff.testing", "--dir", sockdir, "--worker", run_worker])
    try:
        p = subprocess.run(
            [BIN, "conformance", "--app-url", url, "--token-file", env["HANDOFF_TOKEN_FILE"], "--fixture-cmd", fixture, "--leader-cmd", fixture, "--timeout", "3m"],
            env=env, cwd=sockdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=240,
        )
    finally:
        subprocess.run(shlex.split(fixture) + ["stop"], env=env, cwd=sockdir, timeout=30)
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
