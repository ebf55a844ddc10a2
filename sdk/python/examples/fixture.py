#!/usr/bin/env python3
"""The fixture of ``handoff conformance`` for the example workers (``--fixture-cmd`` and ``--leader-cmd``).

    fixture.py --dir DIR [--worker worker.py] STEP [ARG]

``restart`` stops the worker this fixture started last, empties the queue
``DIR/queue`` and starts a fresh worker process (``--worker``, with the
environment given: ``HANDOFF_APP_URL``, ``HANDOFF_TOKEN_FILE``), logging to
``DIR/worker.log``; it returns once the worker answers. ``stop`` stops it.
Every other step (hold N, hold-cancelable N, finish, lead LEASE, stopping
LEASE, release LEASE) goes to the worker's control socket ``DIR/control.sock``;
``yes``/``no`` answers are printed.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time


def alive(pid: int) -> bool:
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is gone
    except OSError:
        return False


def stop(d: str) -> None:
    pidfile = os.path.join(d, "worker.pid")
    try:
        with open(pidfile) as f:
            pid = int(f.read())
    except (OSError, ValueError):
        return
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            break
        end = time.monotonic() + wait
        while alive(pid) and time.monotonic() < end:
            time.sleep(0.01)
        if not alive(pid):
            break
    os.remove(pidfile)


def send(d: str, words: "list[str]", timeout: float = 30.0) -> str:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(os.path.join(d, "control.sock"))
        s.sendall((" ".join(words) + "\n").encode())
        out = b""
        while not out.endswith(b"\n"):
            chunk = s.recv(4096)
            if not chunk:
                break
            out += chunk
        return out.decode().strip()
    finally:
        s.close()


def restart(d: str, worker: str) -> None:
    import subprocess

    stop(d)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from filequeue import FileQueue

    FileQueue(os.path.join(d, "queue"), "fixture").purge()
    ctl = os.path.join(d, "control.sock")
    if os.path.exists(ctl):
        os.remove(ctl)
    with open(os.path.join(d, "worker.log"), "ab") as logf:
        p = subprocess.Popen(
            [sys.executable, worker, "--queue", os.path.join(d, "queue"), "--control", ctl],
            stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True, close_fds=True,
        )
    with open(os.path.join(d, "worker.pid"), "w") as f:
        f.write(str(p.pid))
    end = time.monotonic() + 20.0
    while time.monotonic() < end:
        if p.poll() is not None:
            sys.exit("worker exited with %s: see %s" % (p.returncode, os.path.join(d, "worker.log")))
        try:
            if send(d, ["ping"], 1.0) == "ok":
                return
        except OSError:
            pass
        time.sleep(0.02)
    sys.exit("worker did not answer within 20s: see %s" % os.path.join(d, "worker.log"))


def main() -> None:
    args = sys.argv[1:]
    d, worker = "", os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")
    while args and args[0].startswith("--"):
        if args[0] == "--dir":
            d, args = args[1], args[2:]
        elif args[0] == "--worker":
            worker, args = args[1], args[2:]
        else:
            sys.exit("fixture.py: unknown option %s" % args[0])
    if not d or not args:
        sys.exit(__doc__)
    if args[0] == "restart":
        restart(d, worker)
    elif args[0] == "stop":
        stop(d)
    else:
        answer = send(d, args)
        if answer.startswith("error") or not answer:
            sys.exit("%s: %s" % (" ".join(args), answer or "no answer"))
        if answer != "ok":
            print(answer)


if __name__ == "__main__":
    main()
