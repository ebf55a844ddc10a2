# A minimal app side of the handoff protocol in Python, written from
# docs/protocol.md: it holds no claims and does no leader work, so it is
# always drained. conformance's TestPythonApp runs the suite on it, as an
# app in another language than Go.
#
# python3 app.py SOCKET TOKEN_FILE   (serves on the Unix socket SOCKET; prints "listening SOCKET")
import hashlib, hmac, json, os, re, socket, socketserver, sys, threading, time
from http.server import BaseHTTPRequestHandler
from urllib.parse import urlsplit, parse_qs, unquote
TOKEN = open(sys.argv[2]).read().strip().encode()
SKEW_MS = 30000
NONCES = {}  # nonce -> the Unix ms until which its timestamp is accepted
LEASE_NS = 3600 * 10**9
INT64 = (-(1 << 63), (1 << 63) - 1)

def field(b, name, kind):
    # docs/protocol.md, "Edges of the wire": null reads as absent; an
    # integer is a whole decimal number within 64 bits (1.0, 1e3: 400).
    v = b.get(name)
    if v is None: return {bool: False, int: 0, str: ""}[kind]
    if kind is int and (isinstance(v, bool) or not isinstance(v, int) or not INT64[0] <= v <= INT64[1]):
        raise ValueError("%s: want a whole number in decimal within 64 bits" % name)
    if not isinstance(v, kind): raise ValueError("%s: want a %s" % (name, kind.__name__))
    return v

state = {"stopping": False, "seq": {}, "lock": threading.Lock()}
INSTANCE = os.urandom(8).hex()

def parse_time(s):
    # RFC 3339 with up to nanoseconds, as Go writes it; returns Unix ns
    from datetime import datetime
    main, _, frac = s.partition(".")
    if frac:
        digits = "".join(c for c in frac if c.isdigit())
        rest = frac[len(digits):]
    else:
        main, rest, digits = s[:19], s[19:], ""
    if rest == "Z": rest = "+00:00"
    dt = datetime.fromisoformat(main + rest)
    return int(dt.timestamp()) * 10**9 + int((digits + "000000000")[:9])

class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def address_string(self): return "unix"
    def log_message(self, *a): pass
    def send(self, code, obj, extra=None):
        body = (json.dumps(obj) + "\n").encode()
        head = "HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n" % (code, len(body))
        for k, v in (extra or {}).items(): head += "%s: %s\r\n" % (k, v)
        self.wfile.write(head.encode() + b"\r\n" + body)
    def read_body(self):
        n = int(self.headers.get("Content-Length") or 0)
        self.raw = self.rfile.read(n)
    def body(self):
        if len(self.raw) > 65536: return 413, "body: larger than 65536 bytes"
        raw = self.raw.decode()
        if not raw.strip(): return 400, "body: empty"
        try:
            v, end = json.JSONDecoder().raw_decode(raw.lstrip())
        except ValueError as e:
            return 400, "body: %s" % e
        if raw.lstrip()[end:].strip(): return 400, "body: data after the JSON value"
        if not isinstance(v, dict): return 400, "body: not a JSON object"
        return 200, v
    def authorized(self):
        # docs/protocol.md, "Signed calls"
        scheme, _, sig = self.headers.get("Authorization", "").partition(" ")
        ts, nonce = self.headers.get("Handoff-Timestamp", ""), self.headers.get("Handoff-Nonce", "")
        why = None
        if scheme.upper() != "HANDOFF-HMAC-SHA256" or len(sig) != 64 or not re.fullmatch(r"[0-9]{1,15}", ts) or not re.fullmatch(r"[A-Za-z0-9_-]{16,64}", nonce):
            why = "not a signed call"
        else:
            msg = "\n".join(["HANDOFF-HMAC-SHA256", self.command, self.path, ts, nonce, hashlib.sha256(self.raw).hexdigest()])
            want = hmac.new(TOKEN, msg.encode(), hashlib.sha256).hexdigest()
            now = int(time.time() * 1000)
            with state["lock"]:
                if not hmac.compare_digest(sig.lower().encode(), want.encode()): why = "bad signature"
                elif abs(now - int(ts)) > SKEW_MS: why = "timestamp out of range"
                elif nonce in NONCES: why = "replayed call"
                else:
                    for n in [n for n, until in NONCES.items() if until < now]: del NONCES[n]
                    NONCES[nonce] = int(ts) + SKEW_MS
        if why:
            self.send(401, {"error": why}, {"WWW-Authenticate": 'HANDOFF-HMAC-SHA256 realm="handoff"'})
        return why is None
    def status(self):
        return {"stopping": state["stopping"], "inFlight": 0, "receiving": 0, "drained": True, "instance": INSTANCE}
    def route(self, method):
        self.read_body()
        if len(self.raw) > 65536: return self.send(413, {"error": "body: larger than 65536 bytes"})
        if not self.authorized(): return
        u = urlsplit(self.path); p = u.path
        if p == "/handoff/v1/stop-claiming" and method == "POST":
            state["stopping"] = True; return self.send(200, self.status())
        if p == "/handoff/v1/drain" and method == "GET":
            q = parse_qs(u.query, keep_blank_values=True).get("waitMillis", [])
            if len(q) > 1: return self.send(400, {"error": "waitMillis given twice"})
            if q and q[0].strip() and not q[0].strip().lstrip("+").isdigit():
                return self.send(400, {"error": "waitMillis %r: want a whole number of milliseconds" % q[0]})
            return self.send(200, self.status())  # always drained: holds nothing
        if p == "/handoff/v1/return" and method == "POST":
            code, b = self.body()
            if code != 200: return self.send(code, {"error": b})
            try:
                field(b, "cancel", bool)
                if field(b, "cancelWaitMillis", int) < 0: raise ValueError("cancelWaitMillis below 0")
            except ValueError as e:
                return self.send(400, {"error": "body: %s" % e})
            return self.send(200, {"returned": 0})
        if p.startswith("/handoff/v1/leases/") and len(p) > len("/handoff/v1/leases/") and method == "PUT":
            lease = unquote(p[len("/handoff/v1/leases/"):])  # the segment is percent-decoded
            code, b = self.body()
            if code != 200: return self.send(code, {"error": b})
            try:
                leader = field(b, "leader", bool); seq = field(b, "sequence", int); vf = field(b, "validForMillis", int)
                field(b, "fencingToken", int); field(b, "holderIdentity", str); blease = field(b, "lease", str)
                until = parse_time(b["until"]) if b.get("until") is not None else None
            except Exception as e:
                return self.send(400, {"error": "body: %s" % e})
            if blease and blease != lease: return self.send(400, {"error": "body: lease differs from the path"})
            now = time.time_ns()
            if seq - now > 1 * 10**9: return self.send(422, {"error": "sequence too far ahead"})
            if leader and (vf * 10**6 > LEASE_NS or (until is not None and until - now > LEASE_NS)):
                return self.send(422, {"error": "grant longer than the lease duration"})
            with state["lock"]:
                last = state["seq"].get(lease)
                if last is not None and seq <= last: return self.send(200, {"leader": leader, "stale": True})
                state["seq"][lease] = seq
            return self.send(200, {"leader": leader})
        self.send(405 if p.startswith("/handoff/v1/") else 404, {"error": "no such call"})
    def do_GET(self): self.route("GET")
    def do_POST(self): self.route("POST")
    def do_PUT(self): self.route("PUT")
    def do_DELETE(self): self.route("DELETE")
class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
import stat
if os.path.lexists(sys.argv[1]):  # replace only a stale socket, never a file or a link (docs/protocol.md, Transport)
    if not stat.S_ISSOCK(os.lstat(sys.argv[1]).st_mode): sys.exit("not a socket: " + sys.argv[1])
    os.unlink(sys.argv[1])
srv = Server(sys.argv[1], H)
os.chmod(sys.argv[1], 0o666)
print("listening", sys.argv[1], flush=True)
srv.serve_forever()
