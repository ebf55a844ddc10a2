"""Processes for the Celery tests: a throwaway Redis and RabbitMQ, and "pods" of a handoff sidecar and examples/celery_worker.py.

The servers come from the repository's hack/redis.sh and hack/rabbitmq.sh
(Debian's redis-server and rabbitmq-server, installed with apt-get when
missing), each on free ports, with its files in a directory of the test's;
``stop`` stops them. A pod runs ``handoff sidecar`` as a plain process (no
Kubernetes API: with no Leases the sidecar takes the drain deadline from
``HANDOFF_GRACE_PERIOD``) beside a Celery worker, as ``make demo`` does.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
SDK = os.path.dirname(HERE)
ROOT = os.path.dirname(os.path.dirname(SDK))
EXAMPLES = os.path.join(SDK, "examples")
HACK = os.path.join(ROOT, "hack")
BIN = os.environ.get("HANDOFF_BIN", "")


def missing() -> str:
    """Why the Celery tests cannot run here, or ""."""
    try:
        import celery  # noqa: F401
        import redis  # noqa: F401
    except ImportError as e:
        return "%s (Debian: apt-get install python3-celery python3-redis)" % e
    for script in ("redis.sh", "rabbitmq.sh"):
        if not os.path.exists(os.path.join(HACK, script)):
            return "hack/%s not found: run the Celery tests from a checkout of the repository" % script
    return ""


def free_ports(n: int = 1) -> int:
    """A port p with p..p+n-1 free on 127.0.0.1 (RabbitMQ takes p+1 for its distribution)."""
    for _ in range(200):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        p = s.getsockname()[1]
        s.close()
        if p + n >= 65535:
            continue
        ok = True
        for q in range(p, p + n):
            t = socket.socket()
            try:
                t.bind(("127.0.0.1", q))
            except OSError:
                ok = False
            finally:
                t.close()
        if ok:
            return p
    raise RuntimeError("no free ports")


class Servers:
    """Redis (the ledger, and a broker) and RabbitMQ, started by the hack scripts."""

    def __init__(self, d: str, rabbitmq: bool = True) -> None:
        self.dir = d
        self.redis_dir = os.path.join(d, "redis")
        self.rabbit_dir = os.path.join(d, "rabbitmq")
        env = dict(os.environ, HANDOFF_WATCH_PID=str(os.getpid()))
        self.redis_addr = self._start("redis.sh", self.redis_dir, free_ports(1), env)
        self.redis_url = "redis://%s/0" % self.redis_addr
        self.amqp_url = ""
        if rabbitmq:
            url = self._start("rabbitmq.sh", self.rabbit_dir, free_ports(2), env)
            self.amqp_url = url.rstrip("/") + "//"

    def _start(self, script: str, d: str, port: int, env: Dict[str, str]) -> str:
        p = subprocess.run(
            ["bash", os.path.join(HACK, script), "start", d, str(port)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=180,
        )
        if p.returncode != 0:
            raise RuntimeError("%s start: %s" % (script, p.stderr.decode()[-2000:]))
        return p.stdout.decode().strip()

    def stop(self) -> None:
        for script, d in (("rabbitmq.sh", self.rabbit_dir), ("redis.sh", self.redis_dir)):
            if os.path.isdir(d):
                subprocess.run(["bash", os.path.join(HACK, script), "stop", d], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=180)

    def ledger(self) -> Any:
        import redis

        return redis.Redis.from_url(self.redis_url)


KUBECONFIG = """apiVersion: v1
kind: Config
clusters:
- name: none
  cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}
users:
- name: none
  user: {token: none}
contexts:
- name: none
  context: {cluster: none, user: none}
current-context: none
"""


class Pod:
    """A handoff sidecar and a Celery worker (examples/celery_worker.py) as plain processes, sockets in a directory of their own."""

    def __init__(self, d: str, name: str, broker: str, ledger: str, pool: str, concurrency: int, prefetch: int = 4, grace: str = "8s", sidecar: bool = True) -> None:
        self.name = name
        self.dir = os.path.join(d, name)
        os.makedirs(self.dir, exist_ok=True)
        self.token = os.path.join(self.dir, "token")
        self.app_url = "unix://" + os.path.join(self.dir, "app.sock")
        self.control = "unix://" + os.path.join(self.dir, "control.sock")
        self.worker_log = os.path.join(self.dir, "worker.log")
        self.sidecar_log = os.path.join(self.dir, "sidecar.log")
        self.sidecar: Optional["subprocess.Popen[bytes]"] = None
        self.worker: Optional["subprocess.Popen[bytes]"] = None
        if BIN:
            subprocess.run([BIN, "install", "--token-file", self.token], check=True, stdout=subprocess.DEVNULL)
        else:
            with open(self.token, "w") as f:
                f.write(os.urandom(32).hex() + "\n")
        env = dict(os.environ, HANDOFF_TOKEN_FILE=self.token, HANDOFF_APP_URL=self.app_url)
        for k in ("HANDOFF_LEASE_DURATION", "HANDOFF_SHARDS"):
            env.pop(k, None)
        if sidecar:
            kc = os.path.join(d, "kubeconfig")
            if not os.path.exists(kc):
                with open(kc, "w") as f:
                    f.write(KUBECONFIG)
            senv = dict(
                env, HANDOFF_CONTROL_ADDR=self.control, HANDOFF_POD_NAME=name, HANDOFF_POD_NAMESPACE="default",
                HANDOFF_KUBECONFIG=kc, HANDOFF_METRICS_ADDR="127.0.0.1:0", HANDOFF_GRACE_PERIOD=grace,
            )
            with open(self.sidecar_log, "wb") as f:
                self.sidecar = subprocess.Popen([BIN, "sidecar"], env=senv, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        wenv = dict(
            env, WORKER_NAME=name, CELERY_BROKER_URL=broker, LEDGER_URL=ledger, PREFETCH_MULTIPLIER=str(prefetch),
            PYTHONPATH=os.pathsep.join(p for p in (os.path.join(SDK, "src"), env.get("PYTHONPATH", "")) if p),
        )
        cmd = [
            sys.executable, os.path.join(EXAMPLES, "celery_worker.py"), "worker", "--pool", pool, "--concurrency", str(concurrency),
            "--hostname", "%s@%%h" % name, "--loglevel", "INFO", "--without-mingle", "--without-gossip", "--without-heartbeat",
        ]
        with open(self.worker_log, "wb") as f:
            self.worker = subprocess.Popen(cmd, env=wenv, stdout=f, stderr=subprocess.STDOUT, start_new_session=True, cwd=EXAMPLES)

    def log(self) -> str:
        with open(self.worker_log, errors="replace") as f:
            return f.read()

    def wait_ready(self, timeout: float = 30.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.worker is not None and self.worker.poll() is not None:
                raise RuntimeError("worker %s exited %s:\n%s" % (self.name, self.worker.returncode, self.log()[-3000:]))
            if " ready." in self.log():
                return
            time.sleep(0.05)
        raise RuntimeError("worker %s not ready in %gs:\n%s" % (self.name, timeout, self.log()[-3000:]))

    def prestop(self, timeout: str = "30s") -> str:
        """The kubelet's preStop hook: handoff prestop, blocking until the sidecar's sequence is over."""
        p = subprocess.run(
            [BIN, "prestop", "--addr", self.control, "--token-file", self.token, "--timeout", timeout],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120,
        )
        out = p.stdout.decode()
        if p.returncode != 0:
            raise RuntimeError("prestop of %s: exit %d\n%s" % (self.name, p.returncode, out))
        return out

    def terminate(self, proc: Optional["subprocess.Popen[bytes]"], kill_after: float) -> Optional[int]:
        """SIGTERM, then SIGKILL after kill_after seconds (the kubelet's grace period); the exit code."""
        if proc is None:
            return None
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                return proc.wait(kill_after)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                return proc.wait(10)
        return proc.returncode

    def stop(self) -> None:
        """Kill whatever is left of the pod (its process groups: prefork's children too)."""
        for proc in (self.worker, self.sidecar):
            if proc is not None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    pass


def events(ledger: Any) -> List[Dict[str, Any]]:
    return [json.loads(e) for e in ledger.lrange("events", 0, -1)]


def rmtree(d: str) -> None:
    shutil.rmtree(d, ignore_errors=True)
