"""The threaded server: sockets, signed calls over the wire, framing, one write per answer, long polls."""

from __future__ import annotations

import json
import os
import socket
import stat
import threading
import time
from typing import Dict, List, Optional, Tuple

import pytest

import handoff
from conftest import TOKEN
from handoff.protocol import EndpointError, Leadership, Verifier, parse_endpoint, sign
from handoff.testing import CallError, Client


def serve(sockdir: str, **kw: object) -> Tuple[handoff.Agent, Client]:
    a = handoff.Agent(token=TOKEN, **kw)  # type: ignore[arg-type]
    a.start("unix://%s/app.sock" % sockdir)
    return a, Client(a.url, TOKEN)


def raw_request(method: str, target: str, body: bytes = b"", signed: bool = True, extra: Optional[Dict[str, str]] = None) -> bytes:
    h = {"Host": "localhost", "Content-Length": str(len(body))}
    if signed:
        h.update(sign(TOKEN, method, target, body))
    h.update(extra or {})
    return ("%s %s HTTP/1.1\r\n" % (method, target)).encode() + "".join("%s: %s\r\n" % kv for kv in h.items()).encode() + b"\r\n" + body


def read_response(f: "socket.SocketIO") -> Tuple[int, Dict[str, str], bytes]:
    rd = f  # a buffered reader of the connection
    line = rd.readline()  # type: ignore[attr-defined]
    assert line, "connection closed without an answer"
    status = int(line.split()[1])
    headers: Dict[str, str] = {}
    while True:
        ln = rd.readline().rstrip(b"\r\n")  # type: ignore[attr-defined]
        if not ln:
            break
        k, _, v = ln.decode().partition(":")
        headers[k.strip().lower()] = v.strip()
    body = rd.read(int(headers.get("content-length", "0")))  # type: ignore[attr-defined]
    return status, headers, body


def test_socket_is_made_with_mode_0666_and_removed_at_close(sockdir: str) -> None:
    a, c = serve(sockdir)
    path = os.path.join(sockdir, "app.sock")
    st = os.lstat(path)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o666
    assert c.drain().instance == a.instance
    a.close()
    assert not os.path.exists(path)


def test_socket_path_that_is_not_a_socket_is_refused(sockdir: str) -> None:
    path = os.path.join(sockdir, "app.sock")
    with open(path, "w") as f:
        f.write("keep me")
    with pytest.raises(EndpointError, match="not a socket"):
        serve(sockdir)
    assert open(path).read() == "keep me"
    os.remove(path)
    other = handoff.Agent(token=TOKEN).start("unix://%s/real.sock" % sockdir)
    os.symlink(os.path.join(sockdir, "real.sock"), path)
    with pytest.raises(EndpointError, match="not a socket"):
        serve(sockdir)
    assert os.path.islink(path)
    other.close()


def test_stale_socket_replaced_served_socket_refused(sockdir: str) -> None:
    path = os.path.join(sockdir, "app.sock")
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(path)
    stale.close()  # no server: a connect is refused
    a, c = serve(sockdir)
    c.drain()
    with pytest.raises(EndpointError, match="another process serves it"):
        serve(sockdir)
    a.close()


def test_no_token_refuses_to_start(monkeypatch: pytest.MonkeyPatch, tmp_path: "os.PathLike[str]") -> None:
    with pytest.raises(handoff.ConfigError, match="HANDOFF_TOKEN_FILE"):
        handoff.Agent()
    handoff.Agent(insecure_no_token=True)
    f = os.path.join(str(tmp_path), "token")
    with open(f, "w") as fh:
        fh.write("\n  %s \n" % TOKEN)
    monkeypatch.setenv("HANDOFF_TOKEN_FILE", f)
    handoff.Agent()
    with open(f, "w") as fh:
        fh.write("too short")
    with pytest.raises(handoff.ConfigError, match="no usable token"):
        handoff.Agent(insecure_no_token=True)  # a configured token is required even so
    monkeypatch.setenv("HANDOFF_TOKEN_FILE", f + ".missing")
    with pytest.raises(handoff.ConfigError, match="token file"):
        handoff.Agent()
    with pytest.raises(handoff.ConfigError, match="printable"):
        handoff.Agent(token="x" * 31 + " ")


def test_app_url_from_the_environment(monkeypatch: pytest.MonkeyPatch, sockdir: str) -> None:
    a = handoff.Agent(token=TOKEN)
    with pytest.raises(EndpointError, match="HANDOFF_APP_URL"):
        a.start()
    monkeypatch.setenv("HANDOFF_APP_URL", "unix://%s/env.sock" % sockdir)
    with a:
        assert a.url == "unix://%s/env.sock" % sockdir
        assert Client(a.url, TOKEN).drain().instance == a.instance
    assert not os.path.exists(os.path.join(sockdir, "env.sock"))


@pytest.mark.parametrize(
    "addr,ok",
    [
        ("unix:///handoff-run/app.sock", True),
        ("unix://handoff-run/app.sock", False),
        ("unix:///handoff-run/../app.sock", False),
        ("unix:///a//b.sock", False),
        ("unix:///" + "a" * 107, False),
        ("unix:///" + "a" * 106, True),
        ("http://127.0.0.1:7452", True),
        ("http://127.0.0.1:7452/", True),
        ("127.0.0.1:7450", True),
        ("http://[::1]:7452", True),
        ("http://localhost:7452", False),
        ("http://10.0.0.1:7452", False),
        ("http://127.0.0.1:7452/path", False),
        ("http://127.0.0.1:7452?x=1", False),
        ("http://user@127.0.0.1:7452", False),
        ("127.0.0.1", False),
        ("127.0.0.1:99999", False),
    ],
)
def test_addresses(addr: str, ok: bool) -> None:
    if ok:
        parse_endpoint(addr)
    else:
        with pytest.raises(EndpointError):
            parse_endpoint(addr)


def test_unsigned_and_bad_calls_are_refused_401(sockdir: str) -> None:
    a, c = serve(sockdir)
    try:
        status, headers, body = Client(a.url, None).call("POST", "/handoff/v1/stop-claiming", b"{}")
        assert status == 401 and headers["www-authenticate"] == 'HANDOFF-HMAC-SHA256 realm="handoff"'
        assert "error" in json.loads(body)
        status, _, _ = Client(a.url, "f" * 64).call("POST", "/handoff/v1/stop-claiming", b"{}")
        assert status == 401
        assert not a.stopping.is_set()
        # The signature is checked first: an undefined path unsigned is 401 too.
        assert Client(a.url, None).call("GET", "/nowhere")[0] == 401
    finally:
        a.close()


def test_undefined_paths_and_methods_are_4xx(sockdir: str) -> None:
    a, c = serve(sockdir)
    try:
        assert c.call("GET", "/nowhere")[0] == 404
        assert c.call("GET", "/handoff/v1/leases/a/b")[0] == 404
        status, headers, _ = c.call("GET", "/handoff/v1/stop-claiming")
        assert status == 405 and headers["allow"] == "POST"
        assert c.call("DELETE", "/handoff/v1/leases/x")[0] == 405
        assert not a.stopping.is_set()
    finally:
        a.close()


def test_refused_call_body_is_read_so_the_connection_goes_on(sockdir: str) -> None:
    a, _ = serve(sockdir)
    try:
        s = socket.socket(socket.AF_UNIX)
        s.connect(os.path.join(sockdir, "app.sock"))
        f = s.makefile("rb")
        body = b'{"cancel": false, "pad": "' + b"x" * 5000 + b'"}'
        s.sendall(raw_request("POST", "/handoff/v1/return", body, signed=False))
        assert read_response(f)[0] == 401  # type: ignore[arg-type]
        s.sendall(raw_request("GET", "/nowhere", b"{}" * 100))
        assert read_response(f)[0] == 404  # type: ignore[arg-type]
        s.sendall(raw_request("GET", "/handoff/v1/drain?waitMillis=0"))
        status, _, out = read_response(f)  # type: ignore[arg-type]
        assert status == 200 and json.loads(out)["instance"] == a.instance
        s.close()
    finally:
        a.close()


def test_body_over_64KiB_is_413_and_the_connection_closed(sockdir: str) -> None:
    a, _ = serve(sockdir)
    try:
        s = socket.socket(socket.AF_UNIX)
        s.connect(os.path.join(sockdir, "app.sock"))
        body = b'{"pad": "' + b"x" * (64 << 10) + b'"}'
        s.sendall(raw_request("POST", "/handoff/v1/return", body))
        f = s.makefile("rb")
        status, headers, out = read_response(f)  # type: ignore[arg-type]
        assert status == 413 and headers.get("connection") == "close" and b"65536" in out
        assert f.read() == b""
        s.close()
    finally:
        a.close()


def test_chunked_body(sockdir: str) -> None:
    a, _ = serve(sockdir, return_claims=lambda: 4)
    try:
        body = b'{"cancel": false}'
        h = sign(TOKEN, "POST", "/handoff/v1/return", body)
        req = b"POST /handoff/v1/return HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n"
        req += "".join("%s: %s\r\n" % kv for kv in h.items()).encode() + b"\r\n"
        req += b"5\r\n" + body[:5] + b"\r\n" + b"%x\r\n" % (len(body) - 5) + body[5:] + b"\r\n0\r\n\r\n"
        s = socket.socket(socket.AF_UNIX)
        s.connect(os.path.join(sockdir, "app.sock"))
        s.sendall(req)
        status, _, out = read_response(s.makefile("rb"))  # type: ignore[arg-type]
        assert status == 200 and json.loads(out) == {"returned": 4}
        s.close()
    finally:
        a.close()


class WriteCounter:
    """Counts the server's writes to each connection (socket.sendall and send), by the thread that serves it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.writes: List[Tuple[str, int]] = []
        self.nodelay: List[int] = []
        counter = self
        orig_sendall, orig_send = socket.socket.sendall, socket.socket.send

        def sendall(sock: socket.socket, data: bytes, *args: int) -> None:
            if threading.current_thread().name == "handoff-app-conn":
                counter.writes.append(("sendall", len(data)))
                if sock.family != socket.AF_UNIX:
                    counter.nodelay.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            orig_sendall(sock, data, *args)

        def send(sock: socket.socket, data: bytes, *args: int) -> int:
            if threading.current_thread().name == "handoff-app-conn":
                counter.writes.append(("send", len(data)))
            return orig_send(sock, data, *args)

        monkeypatch.setattr(socket.socket, "sendall", sendall)
        monkeypatch.setattr(socket.socket, "send", send)


@pytest.mark.parametrize("transport", ["unix", "tcp"])
def test_each_answer_is_one_write_with_nodelay_on_tcp(monkeypatch: pytest.MonkeyPatch, sockdir: str, transport: str) -> None:
    counter = WriteCounter(monkeypatch)
    a = handoff.Agent(token=TOKEN)
    a.start("unix://%s/app.sock" % sockdir if transport == "unix" else "http://127.0.0.1:0")
    try:
        c = Client(a.url, TOKEN)
        c.drain()
        c.lead(Leadership("orders", True, time.time_ns(), "", 1, None, 5000))
        c.call("GET", "/handoff/v1/drain?waitMillis=-1")
        Client(a.url, None).call("GET", "/handoff/v1/drain")
        c.stop_claiming()
        assert [w[0] for w in counter.writes] == ["sendall"] * 5, counter.writes
        if transport == "tcp":
            assert counter.nodelay and all(counter.nodelay)
    finally:
        a.close()


def test_drain_long_poll_waits_and_returns_when_drained(sockdir: str) -> None:
    a, c = serve(sockdir)
    try:
        claim = a.begin()
        t0 = time.monotonic()
        st = c.drain(300)
        assert 0.29 <= time.monotonic() - t0 < 2 and not st.drained and st.in_flight == 1
        threading.Timer(0.2, claim.done).start()
        t0 = time.monotonic()
        st = c.drain(20000)
        assert st.drained and time.monotonic() - t0 < 2
        t0 = time.monotonic()
        assert c.drain(99999999).drained and time.monotonic() - t0 < 1, "drained: any wait answers at once"
    finally:
        a.close()


@pytest.mark.parametrize("q", ["-1", "1.5", "1e3", "soon", "0x10", "1&waitMillis=2", "%2D1"])
def test_bad_wait_millis_is_400(sockdir: str, q: str) -> None:
    a, c = serve(sockdir)
    try:
        status, _, body = c.call("GET", "/handoff/v1/drain?waitMillis=" + q)
        assert status == 400 and "waitMillis" in json.loads(body)["error"]
    finally:
        a.close()


@pytest.mark.parametrize("q", ["", "?waitMillis=", "?waitMillis=0", "?waitMillis=+0", "?waitMillis=%200%20", "?other=1&waitMillis=0",
                               "?waitMillis=99999999999999999999"])
def test_good_wait_millis(sockdir: str, q: str) -> None:
    a, c = serve(sockdir)
    try:
        a.stop_claiming()
        status, _, body = c.call("GET", "/handoff/v1/drain" + q)
        assert status == 200 and json.loads(body)["drained"]
    finally:
        a.close()


def test_revoke_over_the_wire_waits_for_leader_work(sockdir: str) -> None:
    a, c = serve(sockdir)
    try:
        c.lead(Leadership("orders", True, time.time_ns(), "", 1, None, 5000))
        work = a.begin_leading("orders")
        got: List[object] = []
        t = threading.Thread(target=lambda: got.append(c.lead(Leadership("orders", False, time.time_ns()))))
        t.start()
        assert work.wait(5)
        time.sleep(0.3)
        assert not got, "revoke acked while leader work runs"
        work.done()
        t.join(5)
        assert got and got[0] == handoff.protocol.LeadershipAck(False)
    finally:
        a.close()


def test_return_over_the_wire(sockdir: str) -> None:
    a, c = serve(sockdir, return_claims=lambda: 3)
    try:
        with pytest.raises(CallError) as e:
            c.return_(cancel=True, cancel_wait_millis=-1)
        assert e.value.status == 400 and "cancelWaitMillis" in e.value.error
        assert not a.stopping.is_set(), "a refused return is not acted on"
        assert c.return_() == handoff.ReturnResult(3)
        assert a.stopping.is_set()
    finally:
        a.close()


def test_full_nonce_memory_is_503_with_retry_after(sockdir: str) -> None:
    a, c = serve(sockdir)
    try:
        a._verifier = Verifier(TOKEN, max_nonces=1)
        assert c.call("GET", "/handoff/v1/drain")[0] == 200
        status, headers, body = c.call("GET", "/handoff/v1/drain")
        assert status == 503 and headers["retry-after"] == "1" and "error" in json.loads(body)
    finally:
        a.close()


def test_many_connections_at_once(sockdir: str) -> None:
    a, c = serve(sockdir)
    try:
        claim = a.begin()
        results: List[int] = []
        lock = threading.Lock()

        def poll() -> None:
            st = c.drain(3000)
            with lock:
                results.append(st.in_flight)

        ts = [threading.Thread(target=poll) for _ in range(80)]  # beyond the 64 served at once
        for t in ts:
            t.start()
        time.sleep(0.3)
        claim.done()
        for t in ts:
            t.join(20)
        assert len(results) == 80 and all(r == 0 for r in results)
    finally:
        a.close()


def expect_continue(path: str) -> Tuple[bytes, int, bytes]:
    """A call sending its body only after the server's 100 Continue: (the interim line, status, body)."""
    body = b'{"cancel": false}'
    h = sign(TOKEN, "POST", "/handoff/v1/return", body)
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    s.connect(path)
    s.sendall(b"POST /handoff/v1/return HTTP/1.1\r\nHost: localhost\r\nExpect: 100-continue\r\nContent-Length: %d\r\n" % len(body)
              + "".join("%s: %s\r\n" % kv for kv in h.items()).encode() + b"\r\n")
    f = s.makefile("rb")
    interim = f.readline()
    assert f.readline() == b"\r\n"
    s.sendall(body)
    status, _, out = read_response(f)  # type: ignore[arg-type]
    s.close()
    return interim, status, out


def test_expect_100_continue(sockdir: str) -> None:
    a, _ = serve(sockdir, return_claims=lambda: 1)
    try:
        interim, status, out = expect_continue(os.path.join(sockdir, "app.sock"))
        assert interim.startswith(b"HTTP/1.1 100") and status == 200 and json.loads(out) == {"returned": 1}
    finally:
        a.close()
