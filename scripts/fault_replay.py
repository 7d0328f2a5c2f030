#!/usr/bin/env python3
"""Replays the five findings of issue 10 against `tokentap serve` with small Python upstreams and
clients on loopback, the way they were found, and prints what happens (docs/operations.md).

    cargo build --release && python3 scripts/fault_replay.py target/release/tokentap

Default configuration apart from the listen addresses and, to keep the run short, a 2 s
`upstream.stream_idle_timeout` (default 120 s). Standard library only; takes about 40 s."""
import http.server
import json
import os
import re
import selectors
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

BIN = os.path.abspath(sys.argv[1])
RUN = tempfile.mkdtemp(prefix="tokentap-replay-")  # the store's data_dir lands here


class Upstream(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        body = b'{"data":[]}'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        length = int(self.headers.get("content-length", "0"))
        request = json.loads(self.rfile.read(length))  # Python: last duplicate key wins
        options = request.get("stream_options") or {}
        jump = request.get("jump", 2)
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()

        def send(text):
            data = text.encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        send('data: {"choices":[{"index":0,"delta":{"content":"a"}}],"usage":{"prompt_tokens":5,"completion_tokens":1}}\n\n')
        send('data: {"choices":[{"index":0,"delta":{"content":"b"}}],"usage":{"prompt_tokens":5,"completion_tokens":%d}}\n\n' % jump)
        if request.get("stall"):
            time.sleep(30)
            return
        if options.get("include_usage"):
            send('data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":%d}}\n\n' % jump)
        send("data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


upstream = Server(("127.0.0.1", 0), Upstream)
threading.Thread(target=upstream.serve_forever, daemon=True).start()
UP = "http://127.0.0.1:%d" % upstream.server_address[1]


def start(upstream_url, env=None):
    e = dict(os.environ, RUST_LOG="info", NO_COLOR="1", **(env or {}))
    p = subprocess.Popen([BIN, "serve", "--upstream", upstream_url, "--listen", "127.0.0.1:0",
                          "--admin", "127.0.0.1:0"], cwd=RUN, env=e, stderr=subprocess.PIPE, text=True)
    log = []
    for line in p.stderr:
        log.append(line)
        if "tokentap is forwarding" in line:
            break
    threading.Thread(target=lambda: [log.append(l) for l in p.stderr], daemon=True).start()
    m = re.search(r"proxy=(\S+) admin=(\S+)", log[-1])
    return p, log, m.group(1), m.group(2)


def rss_mib(pid):
    for line in open("/proc/%d/status" % pid):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024


def post(addr, body, timeout=60):
    req = urllib.request.Request("http://%s/v1/chat/completions" % addr, data=body.encode(),
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def metrics(admin):
    return urllib.request.urlopen("http://%s/metrics" % admin, timeout=10).read().decode()


proc, log, PROXY, ADMIN = start(UP, {"TOKENTAP_UPSTREAM__STREAM_IDLE_TIMEOUT": "2s"})
print("tokentap", PROXY, "rss %.0f MiB" % rss_mib(proc.pid))

# 1. Absurd usage jumps.
for jump in (2, 5 * 10**7, 2**64 - 1, 2, 5 * 10**7, 2**64 - 1, 2, 2**64 - 1):
    t = time.monotonic()
    status, text = post(PROXY, json.dumps({"model": "m", "stream": True, "jump": jump,
                                             "stream_options": {"include_usage": True, "continuous_usage_stats": True}}))
    print("1. jump %d: status %d, %.1f ms, rss %.0f MiB" % (jump, status, (time.monotonic() - t) * 1000, rss_mib(proc.pid)))
print("   clamped:", [l for l in metrics(ADMIN).splitlines() if l.startswith("tokentap_clamped")])

# 2. 1,000 silent sockets (800 silent, 200 bare HTTP/2 prefaces), default header timeout 10 s.
sel = selectors.DefaultSelector()
opened = {}
t0 = time.monotonic()
for i in range(1000):
    s = socket.create_connection((PROXY.rsplit(":", 1)[0], int(PROXY.rsplit(":", 1)[1])))
    if i >= 800:
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
    s.setblocking(False)
    opened[s] = time.monotonic()
    sel.register(s, selectors.EVENT_READ)
print("2. opening 1,000 sockets took %.2f s" % (time.monotonic() - t0))
status, _ = post(PROXY, json.dumps({"model": "m", "stream": True}))
print("2. a request while 1,000 sockets sit silent: status", status)
lifetimes = []
deadline = time.monotonic() + 30
while opened and time.monotonic() < deadline:
    for key, _ in sel.select(timeout=1):
        s = key.fileobj
        try:
            data = s.recv(4096)
        except BlockingIOError:
            continue
        except OSError:
            data = b""
        if not data:
            lifetimes.append(time.monotonic() - opened.pop(s))
            sel.unregister(s)
            s.close()
print("2. 1,000 silent sockets: each closed %.2f-%.2f s after it was opened (header_read_timeout 10 s); all closed %.2f s after the first was opened; still open: %d"
      % (min(lifetimes), max(lifetimes), time.monotonic() - t0, len(opened)))

# 3. 20 stalled 8 MiB bodies, and a stalled upstream.
base = rss_mib(proc.pid)
results = []


def stalled_body():
    s = socket.create_connection((PROXY.rsplit(":", 1)[0], int(PROXY.rsplit(":", 1)[1])))
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % (8 << 20))
    s.sendall(b" " * ((8 << 20) - 1024))
    sent = time.monotonic()
    s.settimeout(60)
    answer = s.recv(4096)
    results.append((answer.split(b"\r\n")[0].decode(), time.monotonic() - sent))
    s.close()


threads = [threading.Thread(target=stalled_body) for _ in range(20)]
for th in threads:
    th.start()
peak = base
while any(th.is_alive() for th in threads):
    peak = max(peak, rss_mib(proc.pid))
    time.sleep(0.1)
time.sleep(0.5)
print("3. 20 stalled bodies: RSS %.0f MiB before, %.0f MiB peak, %.0f MiB after; answers %s; slowest %.1f s after its last byte (body_idle_timeout 10 s)"
      % (base, peak, rss_mib(proc.pid), sorted(set(r[0] for r in results)), max(r[1] for r in results)))
t = time.monotonic()
try:
    status, text = post(PROXY, json.dumps({"model": "m", "stream": True, "stall": True}))
    outcome = "clean end (wrong)"
except Exception as e:  # the stream must break off
    outcome = "broke off: %s" % type(e).__name__
print("3. stalled upstream: %s after %.1f s (stream_idle_timeout 2 s)" % (outcome, time.monotonic() - t))
time.sleep(0.5)
print("   ", [l for l in metrics(ADMIN).splitlines() if 'outcome="upstream_stalled"' in l and l.startswith("tokentap_requests_total")][:1])
print("   ", [l for l in metrics(ADMIN).splitlines() if l.startswith("tokentap_faults_total") and 'listener="proxy"' in l and not l.endswith(" 0")])

# 5. Duplicate keys and escaped key names, read by Python's json upstream.
for body in ['{"model":"m","stream":true,"stream_options":{},"stream_options":{"include_usage":true}}',
             '{"model":"m","stream":true,"stream\\u005foptions":{"include\\u005fusage":true}}']:
    status, text = post(PROXY, body)
    print("5. %s -> usage chunk kept: %s" % (body, '"choices":[],"usage"' in text))
proc.terminate()
proc.wait()

# 4. Credentials in the upstream URL.
dead = socket.socket()
dead.bind(("127.0.0.1", 0))
port = dead.getsockname()[1]
dead.close()
proc, log, PROXY, ADMIN = start("http://user:secret@127.0.0.1:%d" % port)
status, text = post(PROXY, '{"model":"m"}')
time.sleep(0.3)
everything = text + "".join(log) + metrics(ADMIN)
print("4. status %d, body %s" % (status, text.strip()))
print("4. 'secret' in body, log or metrics:", "secret" in everything, "; 'user:' anywhere:", "user:" in everything)
proc.terminate()
proc.wait()
