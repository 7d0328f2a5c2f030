#!/usr/bin/env python3
"""The live conformance harness: real engines, direct and through `tokentap serve`.

For each engine (vLLM CPU, llama.cpp's server) it starts the engine on loopback with the model
that make_model.py made, starts `tokentap serve` in front of it, and then:

1. plain requests on every metered route (chat, completions; streamed without stream_options,
   with include_usage, with continuous usage; not streamed), each sent direct, through tokentap,
   and direct again in the form tokentap forwards it (usage injected); the bytes are compared
   after normalising only what the engine randomises per request, and written as fixtures in
   tests/fixtures/engines/<engine>-<version>/live-<case>/;
2. real benchmark clients (`vllm bench serve`, sglang's serving client) at the same load direct
   and through tokentap, back to back, with the engine's and tokentap's /metrics scraped before
   and after each run (histogram deltas: only that run's requests count);
3. `tokentap sweep --target <engine>` with default prompt mode, and `vllm bench serve` at each
   sweep cell's prompt length and concurrency for the per-request tok/s comparison.

Writes <out>/results.json (everything measured) and <out>/results.md (the tables). Only the
standard library: it runs under any of the harness's virtual environments.
"""

import argparse
import datetime
import http.client
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.parse

MODEL_NAME = "tiny-llama"

# `--pin`: everything but the engine's compute runs on core 0 (`taskset -c 0`), the engine's
# compute thread on core 1 (vLLM: VLLM_CPU_OMP_THREADS_BIND), so a client's own CPU work cannot
# slow the engine it measures. Filled in by main().
PIN_OTHERS = []
PIN_ENGINE_CORE = None

# ---------------------------------------------------------------------------------------------
# Processes and HTTP


class Proc:
    """A child process in its own process group, logging to a file; stopped by its own pid."""

    def __init__(self, name, argv, log_dir, env=None, cwd=None):
        self.name = name
        self.log_path = os.path.join(log_dir, f"{name}.log")
        self.log = open(self.log_path, "wb")
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.popen = subprocess.Popen(
            argv, stdout=self.log, stderr=subprocess.STDOUT, env=full_env, cwd=cwd, start_new_session=True
        )

    def alive(self):
        return self.popen.poll() is None

    def stop(self, grace=20):
        if self.alive():
            try:
                os.killpg(self.popen.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.popen.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.popen.wait(10)
        self.log.close()

    def tail(self, lines=30):
        try:
            with open(self.log_path, "rb") as f:
                return b"\n".join(f.read().splitlines()[-lines:]).decode("utf-8", "replace")
        except OSError:
            return ""


def http_call(port, method, path, body=None, headers=None, timeout=300):
    """One request on a fresh connection; returns (status, headers dict, body bytes as received)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        hdrs = {"Content-Type": "application/json"} if body is not None else {}
        hdrs.update(headers or {})
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        conn.request(method, path, body=data, headers=hdrs)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def port_in_use(port):
    import socket

    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def wait_until(what, check, timeout, proc=None):
    """Polls check() every half second until it is truthy; bounded by timeout."""
    deadline = time.monotonic() + timeout
    last_error = None
    while time.monotonic() < deadline:
        if proc is not None and not proc.alive():
            raise RuntimeError(f"{what}: process exited\n{proc.tail()}")
        try:
            if check():
                return
        except OSError as e:
            last_error = e
        time.sleep(0.5)
    raise RuntimeError(f"{what}: not ready after {timeout}s ({last_error})\n{proc.tail() if proc else ''}")


def scrape(port):
    status, _, body = http_call(port, "GET", "/metrics", timeout=30)
    return body.decode("utf-8", "replace") if status == 200 else ""


def metric_sum(text, name, label_filter=None):
    """Sum of every sample of `name` (exact metric name, any labels matching label_filter)."""
    total, found = 0.0, False
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        rest = line[len(name):]
        if rest and rest[0] not in "{ ":
            continue
        labels = ""
        if rest.startswith("{"):
            end = rest.find("}")
            labels, rest = rest[1:end], rest[end + 1:]
        if label_filter and not all(f in labels for f in label_filter):
            continue
        try:
            total += float(rest.split()[0])
            found = True
        except (ValueError, IndexError):
            continue
    return total if found else None


def hist_delta(before, after, name, label_filter=None):
    """(count, sum, mean) of a histogram over the interval between two scrapes."""
    c0 = metric_sum(before, name + "_count", label_filter) or 0.0
    c1 = metric_sum(after, name + "_count", label_filter)
    s0 = metric_sum(before, name + "_sum", label_filter) or 0.0
    s1 = metric_sum(after, name + "_sum", label_filter)
    if c1 is None or s1 is None:
        return None
    count, total = c1 - c0, s1 - s0
    return {"count": count, "sum": total, "mean": total / count if count else None}


def hist_mean_ms(before, after, name):
    d = hist_delta(before, after, name)
    return d["mean"] * 1000 if d and d.get("mean") is not None else None


def counter_delta(before, after, name, label_filter=None):
    a = metric_sum(after, name, label_filter)
    if a is None:
        return None
    return a - (metric_sum(before, name, label_filter) or 0.0)


# ---------------------------------------------------------------------------------------------
# Engines


class Engine:
    """How to start one engine and what it honours."""

    case_prefix = "live-"
    sends_usage_unasked = False
    # The engine's own /metrics names (when has_metrics): what bench_pair reads around each run.
    metric_names = {
        "ttft": "vllm:time_to_first_token_seconds",
        "itl": "vllm:inter_token_latency_seconds",
        "tpot": "vllm:request_time_per_output_token_seconds",
        "generation_tokens": "vllm:generation_tokens_total",
        "requests": "vllm:request_success_total",
    }
    # The engine's running and queued gauges answer on /metrics (the sweep's server state).
    has_server_state = True
    # sglang.benchmark.serving backends run against this engine (direct and through).
    sglang_backends = ["vllm-chat"]
    # Parts left out unless --parts names them.
    default_skip = set()
    tokentap_env = {}
    load_defaults = {}

    def bench_extra_body(self, output_len):
        """Fields the benchmark clients must add for this engine (None: the clients' own body)."""
        return None
    # The engine's name in fixture folders (tests/fixtures/engines/<fixture_name>-<version>).
    fixture_name = None

    def __init__(self, key, home, port, log_dir):
        self.key, self.home, self.port, self.log_dir = key, home, port, log_dir
        self.proc = None
        self.version = None

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def attach(self):
        """Uses an engine already serving on the port (started by hand, kept running)."""
        if not self.ready():
            raise RuntimeError(f"--attach: nothing serving {MODEL_NAME} on {self.url}")
        self.version = self.ask_version()

    def ready(self):
        status, _, body = http_call(self.port, "GET", "/v1/models", timeout=5)
        return status == 200 and MODEL_NAME.encode() in body


class Vllm(Engine):
    label = "vLLM"
    has_metrics = True
    honours_ignore_eos = True
    extra_args = []

    def start(self):
        venv = os.path.join(self.home, "venv-vllm")
        env = {
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_TARGET_DEVICE": "cpu",
            "HF_HUB_OFFLINE": "1",
            # Anything that still tries the hub meets a closed loopback port at once.
            "HF_ENDPOINT": "http://127.0.0.1:9",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
        }
        argv = [
            os.path.join(venv, "bin", "vllm"), "serve", os.path.join(self.home, "models", "tiny", "hf"),
            "--host", "127.0.0.1", "--port", str(self.port), "--served-model-name", MODEL_NAME,
            "--dtype", "bfloat16", "--max-model-len", "2048", "--seed", "0",
        ] + self.extra_args
        if PIN_ENGINE_CORE is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = PIN_ENGINE_CORE
        self.proc = Proc(self.key, PIN_OTHERS + argv, self.log_dir, env=env)
        wait_until("vllm serve", self.ready, 900, self.proc)
        self.version = self.ask_version()

    def ask_version(self):
        status, _, body = http_call(self.port, "GET", "/version", timeout=5)
        return json.loads(body).get("version", "unknown").split("+")[0] if status == 200 else "unknown"


class VllmForceUsage(Vllm):
    """vLLM with --enable-force-include-usage: usage goes to clients that never asked for it."""

    label = "vLLM --enable-force-include-usage"
    fixture_name = "vllm"
    extra_args = ["--enable-force-include-usage"]
    case_prefix = "live-force-usage-"
    sends_usage_unasked = True
    # vLLM does not say over HTTP that it sends usage unasked; tokentap is told so (config).
    # "every_chunk": the force flag sends usage on every chunk (sglang's flag: "final").
    tokentap_env = {"TOKENTAP_UPSTREAM__SENDS_USAGE_UNASKED": "every_chunk"}


class LlamaCpp(Engine):
    label = "llama.cpp (llama-cpp-python server)"
    has_metrics = False
    honours_ignore_eos = False
    load_defaults = {
        "bench_prompts": 16, "bench_input": 128, "bench_output": 32,
        "sweep_contexts": "256", "sweep_concurrency": "1,2", "sweep_max_output": 64, "ttft_prompts": 30,
    }

    def bench_extra_body(self, output_len):
        # The clients send max_completion_tokens, which llama-cpp-python ignores: without
        # max_tokens a random model runs to the context limit.
        return {"max_tokens": output_len}

    def start(self):
        venv = os.path.join(self.home, "venv-llamacpp")
        python = os.path.join(venv, "bin", "python")
        launcher = os.path.join(os.path.dirname(os.path.abspath(__file__)), "llamacpp_server.py")
        argv = [
            python, launcher, "--model", os.path.join(self.home, "models", "tiny", "model.gguf"),
            "--model_alias", MODEL_NAME, "--host", "127.0.0.1", "--port", str(self.port),
            "--n_ctx", "2048", "--interrupt_requests", "False", "--seed", "0",
            # One thread: two threads meet at a spinning barrier every op, and on a shared,
            # loaded machine a descheduled partner turns 10 ms tokens into 1 s tokens.
            "--n_threads", "1", "--n_threads_batch", "1",
        ]
        self.proc = Proc("llamacpp", argv, self.log_dir, env={"HF_HUB_OFFLINE": "1"})
        wait_until("llama.cpp server", self.ready, 300, self.proc)
        self.version = self.ask_version()

    def ask_version(self):
        python = os.path.join(self.home, "venv-llamacpp", "bin", "python")
        out = subprocess.run(
            [python, "-c", "import llama_cpp; print(llama_cpp.__version__)"], capture_output=True, text=True
        )
        return out.stdout.strip() or "unknown"


class Sglang(Engine):
    """sglang 0.5.23's own HTTP stack (launch_server: FastAPI app, TokenizerManager, detokenizer
    process, ZMQ IPC), unmodified, with its scheduler hook pointed at sglang_fake_engine.py: a
    fake scheduler that emits a fixed sentence one token per step (~42 ms: it waits up to
    FAKE_ENGINE_STEP_MS, 20, for new requests, then sleeps as long), then EOS (cycled under
    ignore_eos). Every byte a client sees is written by sglang's code; only the
    model is fake. /metrics is sglang's HTTP side (TTFT, ITL, token counters from the
    TokenizerManager); the scheduler's gauges (running, queued, KV) are not there."""

    label = "sglang (its own HTTP stack, fake scheduler)"
    fixture_name = "sglang"
    case_prefix = ""
    has_metrics = True
    has_server_state = False
    honours_ignore_eos = True
    metric_names = {
        "ttft": "sglang:time_to_first_token_seconds",
        "itl": "sglang:inter_token_latency_seconds",
        "tpot": None,
        "generation_tokens": "sglang:generation_tokens_total",
        "requests": "sglang:num_requests_total",
    }
    load_defaults = {"sweep_max_output": 128}
    # sglang's own client on sglang's own routes: /generate and chat.
    sglang_backends = ["sglang", "sglang-oai-chat"]
    # The pairs compare prefix-cache states and the engine's own speed under a client's CPU
    # load; the fake scheduler has no cache and a fixed step.
    default_skip = {"pairs"}

    def start(self):
        venv = os.path.join(self.home, "venv-sglang-server")
        launcher = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sglang_fake_engine.py")
        argv = [
            os.path.join(venv, "bin", "python"), launcher,
            "--model-path", os.path.join(self.home, "models", "tiny", "hf"),
            "--served-model-name", MODEL_NAME, "--host", "127.0.0.1", "--port", str(self.port),
            "--context-length", "2048", "--enable-metrics",
        ]
        env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}
        self.proc = Proc(self.key, PIN_OTHERS + argv, self.log_dir, env=env)
        wait_until("sglang launch_server", self.ready, 600, self.proc)
        self.version = self.ask_version()

    def ready(self):
        # /v1/models answers before the scheduler is up; /health runs a one-token generation.
        return super().ready() and http_call(self.port, "GET", "/health", timeout=10)[0] == 200

    def ask_version(self):
        python = os.path.join(self.home, "venv-sglang-server", "bin", "python")
        out = subprocess.run(
            [python, "-c", "import importlib.metadata as m; print(m.version('sglang'))"],
            capture_output=True, text=True,
        )
        return out.stdout.strip() or "unknown"

    def cases(self):
        """The byte-identity cases of issue 24: every metered route and usage mode, EOS, n=2,
        token-id prompts, /generate, and the error answers."""
        common = {"model": MODEL_NAME, "max_tokens": 24, "temperature": 0, "seed": 7, "ignore_eos": True}
        chat = dict(common, messages=[{"role": "user", "content": "Tell me about tokens and latency."}])
        comp = dict(common, prompt="The server streams tokens to the client")
        ids = dict(common, prompt=[72, 101, 108, 108, 111, 32, 116, 111, 107, 101, 110, 115])
        usage = {"include_usage": True}
        continuous = {"include_usage": True, "continuous_usage_stats": True}
        gen = {"text": "The server streams tokens to the client",
               "sampling_params": {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}}
        # Past the 2,048-token context: ~2,100 tokens of one short word.
        too_long = " ".join(["go"] * 2100)
        chat_eos = {k: v for k, v in chat.items() if k != "ignore_eos"}
        C, P, G = "/v1/chat/completions", "/v1/completions", "/generate"
        return [
            ("chat-stream", C, dict(chat, stream=True)),
            ("chat-stream-usage", C, dict(chat, stream=True, stream_options=usage)),
            ("chat-stream-continuous", C, dict(chat, stream=True, stream_options=continuous)),
            ("chat-stream-eos", C, dict(chat_eos, stream=True, max_tokens=64)),
            ("chat-stream-n2", C, dict(chat, stream=True, n=2, max_tokens=6)),
            ("chat-nonstream", C, dict(chat, stream=False)),
            ("completions-stream", P, dict(comp, stream=True)),
            ("completions-stream-usage", P, dict(comp, stream=True, stream_options=usage)),
            ("completions-tokenids-stream", P, dict(ids, stream=True)),
            ("completions-tokenids-usage", P, dict(ids, stream=True, stream_options=usage)),
            ("completions-nonstream", P, dict(comp, stream=False)),
            ("generate-stream", G, dict(gen, stream=True)),
            ("generate-nonstream", G, dict(gen, stream=False)),
            ("too-long-chat-stream", C, dict(chat, stream=True, messages=[{"role": "user", "content": too_long}])),
            ("too-long-generate-stream", G, dict(gen, stream=True, text=too_long)),
            ("invalid-json", C, b'{"model": "tiny-llama", "stream": true, "messages": ['),
            ("invalid-request", C, {"model": MODEL_NAME, "stream": True, "max_tokens": "many"}),
        ]


# The load each engine gets unless a flag says otherwise: sized so that a run ends in minutes on
# 2 cores (llama-cpp-python serves one request at a time at ~80 ms a token here).
# The random tokens after the shared prefix in the pairs' second client run (see `pairs`).
PAIR_UNSHARED_TOKENS = 16

LOAD_DEFAULTS = {
    "bench_prompts": 40, "bench_concurrency": 4, "bench_input": 256, "bench_output": 128,
    "sweep_contexts": "256,512", "sweep_concurrency": "1,2,4,8", "sweep_cell_duration": "10s",
    "sweep_max_output": 256, "ttft_prompts": 100, "ttft_concurrency": "1,4",
}


def engine_args(args, engine):
    """args with every load flag left out filled from the engine's defaults, then LOAD_DEFAULTS."""
    import copy

    filled = copy.copy(args)
    for key, value in LOAD_DEFAULTS.items():
        if getattr(filled, key) is None:
            setattr(filled, key, engine.load_defaults.get(key, value))
    return filled


ENGINES = {
    "vllm": (Vllm, 18100),
    "llamacpp": (LlamaCpp, 18200),
    "vllm-force-usage": (VllmForceUsage, 18300),
    "sglang": (Sglang, 18400),
}


class Tokentap:
    def __init__(self, binary, upstream_url, port, admin_port, log_dir, name, extra_env=None):
        self.port, self.admin_port = port, admin_port
        env = {
            "TOKENTAP_PROXY__LISTEN": f"127.0.0.1:{port}",
            "TOKENTAP_ADMIN__LISTEN": f"127.0.0.1:{admin_port}",
            "TOKENTAP_STORE__DATA_DIR": "",
            "RUST_LOG": "warn",
        }
        env.update(extra_env or {})
        self.proc = Proc(name, PIN_OTHERS + [binary, "serve", "--upstream", upstream_url], log_dir, env=env)
        wait_until(
            "tokentap serve",
            lambda: http_call(admin_port, "GET", "/healthz", timeout=5)[0] == 200,
            60,
            self.proc,
        )

    def metrics(self):
        return scrape(self.admin_port)


# ---------------------------------------------------------------------------------------------
# tokentap's own refusals: real clients through the default policy must meet none

# The faults for which tokentap itself answers 403 (tokentap_faults_total{listener="proxy"}): a
# route proxy.routes does not forward, a field run as code, another caller's engine session.
REFUSAL_FAULTS = ("route_refused", "code_field_refused", "session_refused")
# src/proxy/refusals.rs logs each refused path once, at warn, with these words; past its bound
# (256 paths) one summary line a minute counts the rest.
REFUSAL_LOG = "refused on the data port"
# `path=/x` in the text format, `"path":"/x"` in the JSON one.
LOGGED_PATH = re.compile(r'(?:\bpath=(\S+)|"path":"((?:[^"\\]|\\.)*)")')


def refusal_counts(metrics_text):
    """{fault: count} of tokentap's own 403s on one of its /metrics pages (a fault not on the
    page counts 0)."""
    return {
        fault: metric_sum(metrics_text, "tokentap_faults_total", ['listener="proxy"', f'fault="{fault}"']) or 0.0
        for fault in REFUSAL_FAULTS
    }


def refused_paths(log_text):
    """The paths tokentap's refusal log lines name, in order, each once; a summary line (paths
    past the log's bound) adds `(more paths, see tokentap_faults_total)`."""
    paths = []
    for line in log_text.splitlines():
        if REFUSAL_LOG not in line:
            continue
        found = LOGGED_PATH.search(line)
        path = (found.group(1) or found.group(2)) if found else "(more paths, see tokentap_faults_total)"
        if path not in paths:
            paths.append(path)
    return paths


class RefusalWatch:
    """Reads, after each client step through a tokentap, whether that tokentap refused anything
    since the step before: its refusal counters (the authority: every refusal counts) and the
    log lines written since (which name each path the first time it is refused). A refusal is
    recorded under the engine's `refused` with the step, the counts and the paths; `fail()`
    raises naming them all."""

    def __init__(self, tap):
        self.tap = tap
        self.counts = refusal_counts(tap.metrics())
        self.log_at = self._log_size()

    def _log_size(self):
        try:
            return os.path.getsize(self.tap.proc.log_path)
        except OSError:
            return 0

    def _log_since(self, offset):
        try:
            with open(self.tap.proc.log_path, "rb") as f:
                f.seek(offset)
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def check(self, step, eng):
        """After `step`: the refusals since the last check, recorded in `eng`; None if none."""
        counts = refusal_counts(self.tap.metrics())
        size = self._log_size()
        new_log = self._log_since(self.log_at)
        delta = {f: counts[f] - self.counts.get(f, 0.0) for f in REFUSAL_FAULTS if counts[f] > self.counts.get(f, 0.0)}
        self.counts, self.log_at = counts, size
        if not delta:
            return None
        # A path refused in an earlier step is not logged again: then only the whole log names it.
        paths = refused_paths(new_log) or refused_paths(self._log_since(0)) or ["(not logged: see the tokentap log)"]
        refusal = {"step": step, "counts": {f: int(n) for f, n in delta.items()}, "paths": paths}
        eng.setdefault("refused", []).append(refusal)
        print(f"[refused] tokentap refused {sum(delta.values()):.0f} request(s) during {step}: {', '.join(paths)}",
              file=sys.stderr, flush=True)
        return refusal

    @staticmethod
    def fail(eng):
        """Raises if any step met a refusal, naming each step, its counts and its paths."""
        refused = eng.get("refused") or []
        if refused:
            said = "; ".join(
                f"{r['step']}: {', '.join(f'{n} {f}' for f, n in r['counts'].items())} ({', '.join(r['paths'])})"
                for r in refused
            )
            raise RuntimeError(f"tokentap refused real clients' requests through the default policy: {said}")


# ---------------------------------------------------------------------------------------------
# 1. Plain requests on every metered route: bytes direct vs through


def cases(engine):
    """(case name, route, request body) for every metered route and usage mode."""
    if hasattr(engine, "cases"):
        return engine.cases()
    common = {"model": MODEL_NAME, "max_tokens": 24, "temperature": 0, "seed": 7}
    if engine.honours_ignore_eos:
        common["ignore_eos"] = True
    chat = dict(common, messages=[{"role": "user", "content": "Tell me about tokens and latency."}])
    comp = dict(common, prompt="The server streams tokens to the client")
    modes = [
        ("stream", {"stream": True}),
        ("stream-usage", {"stream": True, "stream_options": {"include_usage": True}}),
        (
            "stream-continuous",
            {"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
        ),
        ("nonstream", {"stream": False}),
    ]
    out = []
    for route_name, route, base in (("chat", "/v1/chat/completions", chat), ("completions", "/v1/completions", comp)):
        for mode, extra in modes:
            out.append((f"{engine.case_prefix}{route_name}-{mode}", route, dict(base, **extra)))
    return out


def as_forwarded(body, engine=None):
    """The request as tokentap forwards it: streams get include_usage and continuous_usage_stats.

    Mirrors src/stream/request.rs (injection): both flags are set true when absent or false;
    other fields are untouched (the engine's answer does not depend on key order). A server that
    sends usage on every chunk unasked (vLLM's force flag, `sends_usage_unasked = "every_chunk"`)
    gets the body as sent.
    """
    if isinstance(body, bytes) or not body.get("stream") or getattr(engine, "sends_usage_unasked", False):
        return body
    if "messages" not in body and "prompt" not in body:
        # Nothing is injected into sglang /generate, nor into a request without its prompt
        # (the server refuses it, and sglang's validation error repeats the body).
        return body
    opts = dict(body.get("stream_options") or {})
    opts["include_usage"] = True
    opts["continuous_usage_stats"] = True
    return dict(body, stream_options=opts)


ID_RE = re.compile(rb'"id":\s*"[^"]*"')
CREATED_RE = re.compile(rb'"created":\s*\d+')
# sglang's /generate meta_info: the wall time an event was sent and the request's duration.
TIMES_RE = re.compile(
    rb'"(response_sent_to_client_ts|request_received_ts|api_server_dispatch_finish_ts|request_finished_ts'
    rb'|e2e_latency|first_token_latency|decode_throughput)":\s*[0-9.eE+-]+'
)
PING_RE = re.compile(rb"^: ping - [^\r\n]*\r?\n", re.M)


def normalise(body):
    """Blanks only what the engine randomises per request: ids and timestamps (creation, and
    sglang /generate's meta_info times: received, dispatched, first token sent, finished, and
    the latencies and decode rate measured between them).

    llama-cpp-python's idle `: ping - <time>` comments are dropped too (they depend on wall
    time). Nothing else is touched: system_fingerprint, usage, order and framing must match.
    """
    body = ID_RE.sub(b'"id":"<id>"', body)
    body = CREATED_RE.sub(b'"created":0', body)
    body = TIMES_RE.sub(lambda m: b'"' + m.group(1) + b'":0', body)
    return PING_RE.sub(b"", body)


def choice_order(body):
    """An n > 1 stream with its events grouped by choice, in order within each choice.

    sglang streams each choice of `n` as its own request; how their chunks interleave varies
    from run to run (timing, not the request), so two answers to one request compare equal
    only per choice. Events without a choice (usage, [DONE]) keep their order after them.
    """
    events = [e for e in body.split(b"\n\n") if e]

    def key(event):
        try:
            choices = json.loads(event[len(b"data: "):]).get("choices") or []
            return choices[0].get("index", 0) if choices else 1 << 30
        except (ValueError, AttributeError):
            return 1 << 30

    return b"".join(e + b"\n\n" for e in sorted(events, key=key))


def sse_payloads(body):
    """The data payloads of an SSE body, one string per event (for a readable diff only)."""
    text = body.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")
    events = []
    for block in text.split("\n\n"):
        data = [line[5:].lstrip(" ") for line in block.split("\n") if line.startswith("data:")]
        if data:
            events.append("\n".join(data))
    return events


def describe_difference(a, b, stream):
    """A short human account of how b (through) differs from a (direct)."""
    if a == b:
        return None
    if not stream:
        return f"bodies differ: direct {len(a)} bytes, through {len(b)} bytes"
    ea, eb = sse_payloads(a), sse_payloads(b)
    notes = []
    if len(ea) != len(eb):
        notes.append(f"{len(ea)} events direct, {len(eb)} through")
    for i, (x, y) in enumerate(zip(ea, eb)):
        if x == y:
            continue
        try:
            jx, jy = json.loads(x), json.loads(y)
        except ValueError:
            notes.append(f"event {i}: {x[:80]!r} vs {y[:80]!r}")
            break
        missing = sorted(set(jx) - set(jy))
        added = sorted(set(jy) - set(jx))
        changed = sorted(k for k in set(jx) & set(jy) if jx[k] != jy[k])
        parts = []
        if missing:
            parts.append("missing " + ",".join(missing))
        if added:
            parts.append("added " + ",".join(added))
        if changed:
            parts.append("changed " + ",".join(changed))
        notes.append(f"event {i}: " + "; ".join(parts))
        break
    if not notes:
        notes.append("same events, different framing bytes")
    return "; ".join(notes)


def final_usage(body, stream):
    """The engine's own final usage (prompt_tokens, completion_tokens), if it sent any."""
    try:
        if not stream:
            doc = json.loads(body)
            u = doc.get("usage") or doc.get("meta_info")
            return {"prompt_tokens": u["prompt_tokens"], "completion_tokens": u["completion_tokens"]} if u else None
        usage = None
        for p in sse_payloads(body):
            if p.strip() == "[DONE]":
                continue
            try:
                doc = json.loads(p)
                u = doc.get("usage") or doc.get("meta_info")
            except (ValueError, AttributeError):
                continue
            if u:
                usage = {"prompt_tokens": u["prompt_tokens"], "completion_tokens": u["completion_tokens"]}
        return usage
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def content_sequence(body, stream):
    """What the engine generated, event by event: (choice index, text, finish reason) per choice.

    Usage-only events and usage fields are left out, so a stream with injected usage and one
    without compare equal when the engine chunked the tokens the same way. sglang /generate
    events are (None, cumulative text, finish reason object); an error body is itself.
    """
    def of(doc):
        if not isinstance(doc, dict):
            return [repr(doc)]
        if "meta_info" in doc:
            return [(None, doc.get("text"), json.dumps((doc.get("meta_info") or {}).get("finish_reason")))]
        if "choices" not in doc:
            return [json.dumps(doc, sort_keys=True)]
        key = "delta" if stream else "message"
        return [
            (c.get("index"), (c.get(key) or {}).get("content", c.get("text")), c.get("finish_reason"))
            for c in doc.get("choices") or []
        ]

    if not stream:
        try:
            return of(json.loads(body))
        except ValueError:
            return None
    seq = []
    for p in sse_payloads(body):
        try:
            doc = json.loads(p)
        except ValueError:
            seq.append(p)
            continue
        seq.extend(of(doc))
    return seq


ATTEMPTS = 4


def per_choice(body):
    """Requests whose answer is compared per choice (n > 1: see choice_order)."""
    return isinstance(body, dict) and bool(body.get("stream")) and (body.get("n") or 1) > 1


def capture_case(engine, tap, route, body):
    """Sends one case direct, through, as forwarded, and direct again, until the engine chunks alike.

    vLLM merges tokens into one chunk when its output side lags (timing, not the request), so
    two identical requests can be framed differently. The byte comparison is only meaningful for
    an attempt where the engine framed the direct, through, forwarded and repeated requests the
    same way; up to ATTEMPTS are made and the count is reported.
    """
    stream = isinstance(body, dict) and bool(body.get("stream"))
    for attempt in range(1, ATTEMPTS + 1):
        st_d, h_d, direct = http_call(engine.port, "POST", route, body)
        st_t, h_t, through = http_call(tap.port, "POST", route, body)
        st_u, _, upstream = http_call(engine.port, "POST", route, as_forwarded(body, engine))
        _, _, direct_again = http_call(engine.port, "POST", route, body)
        # The through request is generated by the engine separately too: it must have been
        # chunked alike as well, or a difference would say nothing about tokentap. A tokentap
        # that changed the text would fail this every time, and the last attempt is reported.
        seqs = [content_sequence(b, stream) for b in (direct, upstream, direct_again, through)]
        if per_choice(body):
            seqs = [sorted(q, key=lambda e: e[0] if isinstance(e, tuple) and e[0] is not None else 1 << 30) for q in seqs]
        again = (choice_order if per_choice(body) else (lambda b: b))
        alike = all(q == seqs[0] for q in seqs) and again(normalise(direct)) == again(normalise(direct_again))
        if alike:
            break
    return {
        "status": [st_d, st_t, st_u],
        "headers": (h_d, h_t),
        "direct": direct,
        "through": through,
        "upstream": upstream,
        "direct_again": direct_again,
        "attempts": attempt,
        "engine_alike": alike,
    }


def run_cases(engine, tap, fixture_root, today):
    results = []
    folder = os.path.join(fixture_root, f"{engine.fixture_name or engine.key}-{engine.version}")
    for name, route, body in cases(engine):
        stream = isinstance(body, dict) and bool(body.get("stream"))
        cap = capture_case(engine, tap, route, body)
        direct, through, upstream = cap["direct"], cap["through"], cap["upstream"]
        h_d, h_t = cap["headers"]
        nd, nt = normalise(direct), normalise(through)
        if per_choice(body):
            nd, nt = choice_order(nd), choice_order(nt)
        usage = final_usage(upstream, stream) if stream else final_usage(direct, stream)
        same_content = content_sequence(direct, stream) == content_sequence(through, stream)
        results.append(
            {
                "case": name,
                "route": route,
                "stream": stream,
                "status": cap["status"],
                "attempts": cap["attempts"],
                "content_type_equal": h_d.get("content-type") == h_t.get("content-type"),
                "bytes_equal": nd == nt,
                # Without byte equality: did the engine merely chunk the through request otherwise?
                "same_chunking": same_content,
                "engine_deterministic": cap["engine_alike"],
                "difference": describe_difference(nd, nt, stream),
                "engine_changes_with_usage": describe_difference(nd, normalise(upstream), stream)
                if stream
                else None,
                "usage": usage,
                "events_direct": len(sse_payloads(direct)) if stream else None,
            }
        )
        case_dir = os.path.join(folder, name)
        os.makedirs(case_dir, exist_ok=True)
        meta = {
            "engine": engine.fixture_name or engine.key,
            "version": engine.version,
            "route": route,
            "stream": stream,
            "server_sends_usage_unasked": engine.sends_usage_unasked,
            "captured": today,
            "notes": (
                f"Live capture by conformance/harness.py: {engine.label} {engine.version}, model "
                f"{MODEL_NAME} (random weights, byte-level BPE vocabulary 1024, made by "
                "conformance/make_model.py). upstream.body is the engine's answer to request.json "
                + ("as sent (tokentap injects nothing into a server that sends usage on every chunk)"
                   if engine.sends_usage_unasked
                   else "with tokentap's injection (stream_options include_usage and "
                   "continuous_usage_stats set true)")
                + "; through.body is what the client received through tokentap serve "
                f"({'identical to direct after normalising ids and created' if nd == nt else 'DIFFERS from direct: ' + str(describe_difference(nd, nt, stream))}). "
                + ("The engine framed direct.body and upstream.body alike (same tokens per event)."
                   if cap["engine_alike"]
                   else f"The engine framed them differently in each of {ATTEMPTS} attempts (timing).")
            ),
        }
        if cap["status"][0] != 200:
            meta["status"] = cap["status"][0]
        if per_choice(body):
            meta["compare"] = "per-choice"
            meta["notes"] += " Compared per choice: the interleaving of the choices' chunks varies from run to run."
        with open(os.path.join(case_dir, "meta.json"), "w") as f:
            json.dump(meta, f, indent=2)
            f.write("\n")
        with open(os.path.join(case_dir, "request.json"), "wb") as f:
            # A case whose body is not JSON (invalid-json) is written as sent.
            f.write(body if isinstance(body, bytes) else json.dumps(body).encode() + b"\n")
        for fname, data in (("direct.body", direct), ("upstream.body", upstream), ("through.body", through)):
            with open(os.path.join(case_dir, fname), "wb") as f:
                f.write(data)
        if usage:
            with open(os.path.join(case_dir, "usage.json"), "w") as f:
                json.dump(usage, f)
                f.write("\n")
    return results


# ---------------------------------------------------------------------------------------------
# 2. Benchmark clients


def run_vllm_bench(home, port, label, out_dir, input_len, output_len, prompts, concurrency, seed, route="chat", extra_body=None, prefix_len=0):
    """`vllm bench serve` against a port; returns its saved result JSON (None on failure).

    With prefix_len, every prompt is that many shared tokens followed by input_len random ones,
    and one warm-up request puts the shared prefix in the engine's prefix cache first."""
    venv = os.path.join(home, "venv-vllm")
    shape = f"{prefix_len}+{input_len}" if prefix_len else f"{input_len}"
    fname = f"vllm-bench-{label}-{route}-{shape}-{output_len}-c{concurrency}.json"
    backend, endpoint = ("openai-chat", "/v1/chat/completions") if route == "chat" else ("openai", "/v1/completions")
    argv = [
        os.path.join(venv, "bin", "vllm"), "bench", "serve",
        "--backend", backend, "--base-url", f"http://127.0.0.1:{port}", "--endpoint", endpoint,
        "--model", MODEL_NAME, "--tokenizer", os.path.join(home, "models", "tiny", "hf"),
        "--dataset-name", "random", "--random-input-len", str(input_len),
        "--random-output-len", str(output_len), "--num-prompts", str(prompts),
        "--max-concurrency", str(concurrency), "--ignore-eos", "--seed", str(seed),
        "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--save-result", "--save-detailed", "--result-dir", out_dir, "--result-filename", fname,
    ] + (["--extra-body", json.dumps(extra_body)] if extra_body else []) + (
        ["--random-prefix-len", str(prefix_len), "--num-warmups", "1"] if prefix_len else []
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_ENDPOINT="http://127.0.0.1:9", VLLM_TARGET_DEVICE="cpu")
    log = os.path.join(out_dir, fname.replace(".json", ".log"))
    with open(log, "wb") as f:
        rc = subprocess.run(PIN_OTHERS + argv, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=1800).returncode
    path = os.path.join(out_dir, fname)
    if rc != 0 or not os.path.exists(path):
        return {"error": f"vllm bench serve exited {rc}; see {log}"}
    with open(path) as f:
        return json.load(f)


SGLANG_BACKEND_ROUTES = {"vllm-chat": "/v1/chat/completions", "sglang-oai-chat": "/v1/chat/completions", "sglang": "/generate"}


def run_sglang_bench(home, port, label, out_dir, input_len, output_len, prompts, concurrency, seed, extra_body=None, backend="vllm-chat"):
    venv = os.path.join(home, "venv-sglang")
    fname = f"sglang-bench-{backend}-{label}-{input_len}-{output_len}-c{concurrency}.jsonl"
    path = os.path.join(out_dir, fname)
    if os.path.exists(path):
        os.remove(path)
    argv = [
        # sglang_bench.py: the client unchanged, but its GETs bounded in time (it asks
        # /server_info after the run without a timeout; the fake scheduler never answers).
        os.path.join(venv, "bin", "python"), os.path.join(os.path.dirname(os.path.abspath(__file__)), "sglang_bench.py"),
        "--backend", backend, "--base-url", f"http://127.0.0.1:{port}",
        "--model", MODEL_NAME, "--tokenizer", os.path.join(home, "models", "tiny", "hf"),
        "--dataset-name", "random-ids", "--random-input-len", str(input_len),
        "--random-output-len", str(output_len), "--random-range-ratio", "1.0",
        "--num-prompts", str(prompts), "--max-concurrency", str(concurrency), "--seed", str(seed),
        "--output-file", path, "--output-details",
        # No warm-up request: the engine is warm already, and request and token counts then
        # compare one to one with the engine's and tokentap's.
        "--warmup-requests", "0",
    ] + (["--extra-request-body", json.dumps(extra_body)] if extra_body else [])
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_ENDPOINT="http://127.0.0.1:9")
    log = path.replace(".jsonl", ".log")
    with open(log, "wb") as f:
        rc = subprocess.run(PIN_OTHERS + argv, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=1800).returncode
    if rc != 0 or not os.path.exists(path):
        return {"error": f"sglang bench exited {rc}; see {log}"}
    with open(path) as f:
        lines = [line for line in f if line.strip()]
    return json.loads(lines[-1])


def bench_pair(engine, tap, runner, out_dir, **load):
    """Direct then through at the same load, with metric scrapes around each run."""
    pair = {}
    base_seed = load.pop("seed")
    for n, (label, port) in enumerate((("direct", engine.port), ("through", tap.port))):
        # Same lengths and count, other prompts: with the same seed the second run's prompts
        # would be prefix-cache hits from the first and its TTFT would not be comparable.
        load["seed"] = base_seed + n
        e0 = scrape(engine.port) if engine.has_metrics else ""
        t0 = tap.metrics()
        started = time.monotonic()
        result = runner(port=port, label=label, out_dir=out_dir, **load)
        wall = time.monotonic() - started
        e1 = scrape(engine.port) if engine.has_metrics else ""
        t1 = tap.metrics()
        run = {"client": summarise_client(result), "wall_s": wall}
        if engine.has_metrics:
            names = engine.metric_names
            run["engine"] = {
                "ttft": hist_delta(e0, e1, names["ttft"]),
                "itl": hist_delta(e0, e1, names["itl"]),
                "tpot": hist_delta(e0, e1, names["tpot"]) if names.get("tpot") else None,
                "generation_tokens": counter_delta(e0, e1, names["generation_tokens"]),
                "requests": counter_delta(e0, e1, names["requests"]),
            }
        if label == "through":
            run["tokentap"] = {
                "ttft": hist_delta(t0, t1, "tokentap_time_to_first_token_seconds"),
                "itl": hist_delta(t0, t1, "tokentap_inter_token_latency_seconds"),
                "tbt": hist_delta(t0, t1, "tokentap_time_between_tokens_seconds"),
                "completion_tokens": counter_delta(t0, t1, "tokentap_tokens_total", ['type="completion"']),
                "requests_ok": counter_delta(t0, t1, "tokentap_requests_total", ['outcome="ok"']),
                "requests": counter_delta(t0, t1, "tokentap_requests_total"),
            }
        pair[label] = run
    pair["checks"] = bench_checks(pair, engine.has_metrics)
    return pair


def summarise_client(r):
    """The client's own figures in one shape (vllm bench serve and sglang's client differ)."""
    if not r or "error" in r:
        return r
    keys = {
        "completed": ("completed",),
        "output_tokens": ("total_output_tokens", "total_output"),
        "mean_ttft_ms": ("mean_ttft_ms",),
        "median_ttft_ms": ("median_ttft_ms",),
        "mean_tpot_ms": ("mean_tpot_ms",),
        "mean_itl_ms": ("mean_itl_ms",),
        "median_itl_ms": ("median_itl_ms",),
        "mean_e2el_ms": ("mean_e2el_ms", "mean_e2e_latency_ms"),
    }
    out = {}
    for k, names in keys.items():
        for n in names:
            if n in r:
                out[k] = r[n]
                break
    if "ttfts" in r and r["ttfts"]:
        ttfts = [t for t in r["ttfts"] if t]
        if ttfts:
            out["median_ttft_ms_from_list"] = statistics.median(ttfts) * 1000
    if "itls" in r:
        samples = [x for per in r["itls"] for x in per]
        out["itl_samples"] = len(samples)
    return out


def ratio(a, b):
    try:
        return a / b if a is not None and b else None
    except TypeError:
        return None


def bench_checks(pair, has_engine_metrics):
    d, t = pair["direct"], pair["through"]
    dc, tc, tap = d["client"], t["client"], t.get("tokentap") or {}
    checks = {}
    if not dc or not tc or "error" in dc or "error" in tc:
        checks["error"] = (dc or {}).get("error") or (tc or {}).get("error")
        return checks
    checks["ttft_median_added_ms"] = tc.get("median_ttft_ms", 0) - dc.get("median_ttft_ms", 0)
    checks["ttft_added_within_1ms"] = abs(checks["ttft_median_added_ms"]) <= 1.0
    # Under load the engine's own queueing moves TTFT by far more than a proxy could; the
    # engine's histogram over the same requests takes that out: the client's mean TTFT minus
    # the engine's is what lies between them (API server, network, proxy), direct and through.
    if has_engine_metrics and d.get("engine") and t.get("engine"):
        def outside_engine(run):
            e = run["engine"].get("ttft") or {}
            if e.get("mean") is None or run["client"].get("mean_ttft_ms") is None:
                return None
            return run["client"]["mean_ttft_ms"] - e["mean"] * 1000
        checks["ttft_outside_engine_direct_ms"] = outside_engine(d)
        checks["ttft_outside_engine_through_ms"] = outside_engine(t)
        if None not in (checks["ttft_outside_engine_direct_ms"], checks["ttft_outside_engine_through_ms"]):
            checks["ttft_outside_engine_added_ms"] = (
                checks["ttft_outside_engine_through_ms"] - checks["ttft_outside_engine_direct_ms"]
            )
    tap_ttft_ms = tap["ttft"]["mean"] * 1000 if tap.get("ttft") and tap["ttft"]["mean"] else None
    checks["tokentap_ttft_mean_ms"] = tap_ttft_ms
    checks["client_ttft_mean_ms"] = tc.get("mean_ttft_ms")
    tap_tbt_ms = tap["tbt"]["mean"] * 1000 if tap.get("tbt") and tap["tbt"]["mean"] else None
    checks["tbt_over_client_tpot"] = ratio(tap_tbt_ms, tc.get("mean_tpot_ms"))
    checks["tbt_within_2pct"] = checks["tbt_over_client_tpot"] is not None and abs(checks["tbt_over_client_tpot"] - 1) <= 0.02
    tap_itl_ms = tap["itl"]["mean"] * 1000 if tap.get("itl") and tap["itl"]["mean"] else None
    checks["tokentap_itl_mean_ms"] = tap_itl_ms
    checks["tokentap_itl_count"] = tap["itl"]["count"] if tap.get("itl") else None
    checks["client_itl_mean_ms"] = tc.get("mean_itl_ms")
    checks["itl_over_client"] = ratio(tap_itl_ms, tc.get("mean_itl_ms"))
    checks["output_tokens_exact"] = tap.get("completion_tokens") == tc.get("output_tokens")
    if has_engine_metrics and t.get("engine"):
        checks["output_tokens_exact"] = checks["output_tokens_exact"] and (
            tap.get("completion_tokens") == t["engine"].get("generation_tokens")
        )
    checks["tokentap_completion_tokens"] = tap.get("completion_tokens")
    checks["client_output_tokens"] = tc.get("output_tokens")
    checks["requests_exact"] = tap.get("requests_ok") == tc.get("completed") == tap.get("requests")
    if has_engine_metrics and t.get("engine"):
        e = t["engine"]
        eng_ttft_ms = e["ttft"]["mean"] * 1000 if e.get("ttft") and e["ttft"]["mean"] else None
        checks["engine_ttft_mean_ms"] = eng_ttft_ms
        checks["tokentap_ttft_between_engine_and_client"] = (
            None
            if None in (eng_ttft_ms, tap_ttft_ms, tc.get("mean_ttft_ms"))
            else eng_ttft_ms <= tap_ttft_ms <= tc["mean_ttft_ms"]
        )
        eng_itl_ms = e["itl"]["mean"] * 1000 if e.get("itl") and e["itl"]["mean"] else None
        checks["engine_itl_mean_ms"] = eng_itl_ms
        checks["engine_itl_count"] = e["itl"]["count"] if e.get("itl") else None
        checks["itl_over_engine"] = ratio(tap_itl_ms, eng_itl_ms)
        checks["itl_within_2pct_of_engine"] = checks["itl_over_engine"] is not None and abs(checks["itl_over_engine"] - 1) <= 0.02
        checks["itl_count_equal_engine"] = checks["tokentap_itl_count"] == checks["engine_itl_count"]
        eng_tpot_ms = e["tpot"]["mean"] * 1000 if e.get("tpot") and e["tpot"]["mean"] else None
        checks["engine_tpot_mean_ms"] = eng_tpot_ms
        checks["tbt_over_engine_tpot"] = ratio(tap_tbt_ms, eng_tpot_ms)
        checks["engine_generation_tokens"] = e.get("generation_tokens")
        checks["output_tokens_equal_engine"] = e.get("generation_tokens") == tap.get("completion_tokens")
    return checks


def first_event_ms(port, route, body):
    """Client-side time from sending a streamed request to the first SSE data line, in ms."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        data = json.dumps(body).encode()
        started = time.perf_counter()
        conn.request("POST", route, body=data, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        while True:
            line = resp.readline()
            if not line:
                return None
            if line.startswith(b"data:"):
                first = (time.perf_counter() - started) * 1000
                resp.read()
                return first
    finally:
        conn.close()


def ttft_probe(engine, tap, rounds, concurrency=1):
    """What tokentap adds to the time to the first event.

    Rounds of `concurrency` simultaneous streamed chat requests, alternating direct and through
    round by round (and which goes first), so that load drifts on the shared machine hit both
    sides alike; the medians of each side and the median of the per-round differences of medians.
    """
    from concurrent.futures import ThreadPoolExecutor

    body = {
        "model": MODEL_NAME, "messages": [{"role": "user", "content": "Time to first token, please."}],
        "max_tokens": 4, "temperature": 0, "stream": True,
    }
    direct, through, diffs = [], [], []
    with ThreadPoolExecutor(concurrency) as pool:
        def batch(port):
            got = list(pool.map(lambda _: first_event_ms(port, "/v1/chat/completions", body), range(concurrency)))
            return [x for x in got if x is not None]

        for i in range(rounds):
            order = [(engine.port, direct), (tap.port, through)]
            medians = {}
            for port, into in order if i % 2 == 0 else reversed(order):
                got = batch(port)
                into.extend(got)
                medians[port] = statistics.median(got) if got else None
            if None not in medians.values():
                diffs.append(medians[tap.port] - medians[engine.port])
    return {
        "rounds": rounds,
        "concurrency": concurrency,
        "direct_median_ms": statistics.median(direct) if direct else None,
        "through_median_ms": statistics.median(through) if through else None,
        "added_median_ms": statistics.median(diffs) if diffs else None,
        "within_1ms": bool(diffs) and abs(statistics.median(diffs)) <= 1.0,
    }


def client_ttft_abba(engine, tap, home, out_dir, prompts, concurrency, extra_body):
    """What tokentap adds to a real client's median TTFT: `vllm bench serve` at a fixed
    concurrency, short prompts, run direct, through, through, direct (ABBA), so a load drift that is
    linear over the four runs cancels out of (mean of the through medians) − (mean of the direct
    medians). The four runs send the same prompts (one seed): a run's median depends on its
    prompts (on llama.cpp TTFT is bimodal, ~45 and ~80 ms, and the share of each moves the median
    by several ms), and a 32-token prompt plus the chat template is less than vLLM's 128-token
    KV block, so no run gets prefix-cache hits from another."""
    runs = []
    for n, (label, port) in enumerate((("direct", engine.port), ("through", tap.port), ("through", tap.port), ("direct", engine.port))):
        e0 = scrape(engine.port) if engine.has_metrics else ""
        r = run_vllm_bench(
            home, port=port, label=f"ttft{n}-{label}", out_dir=out_dir, input_len=32, output_len=4,
            prompts=prompts, concurrency=concurrency, seed=200 + concurrency, extra_body=extra_body,
        )
        e1 = scrape(engine.port) if engine.has_metrics else ""
        run = {"label": label, "client": summarise_client(r)}
        if engine.has_metrics:
            run["engine_ttft"] = hist_delta(e0, e1, engine.metric_names["ttft"])
        runs.append(run)
    medians = {"direct": [], "through": []}
    for run in runs:
        m = (run["client"] or {}).get("median_ttft_ms")
        if m is not None:
            medians[run["label"]].append(m)
    result = {"prompts": prompts, "concurrency": concurrency, "input_len": 32, "output_len": 4, "runs": runs}
    if len(medians["direct"]) == 2 and len(medians["through"]) == 2:
        result["direct_median_ms"] = statistics.mean(medians["direct"])
        result["through_median_ms"] = statistics.mean(medians["through"])
        result["added_ms"] = result["through_median_ms"] - result["direct_median_ms"]
        result["within_1ms"] = abs(result["added_ms"]) <= 1.0
    else:
        result["error"] = "a client run failed; see its log in the results directory"
    return result


# ---------------------------------------------------------------------------------------------
# 3. The sweep


def run_sweep(binary, engine, out_dir, contexts, concurrency, cell_duration, max_output, prompt=None, tag="all"):
    sweep_dir = os.path.join(out_dir, f"sweep-{engine.key}-{tag}")
    shutil.rmtree(sweep_dir, ignore_errors=True)
    argv = [
        binary, "sweep", "--target", engine.url, "--contexts", ",".join(map(str, contexts)),
        "--concurrency", ",".join(map(str, concurrency)), "--cell-duration", cell_duration,
        "--max-output", str(max_output), "--out", sweep_dir, "--quiet",
    ] + (["--prompt", prompt] if prompt else [])
    env = dict(os.environ, TOKENTAP_STORE__DATA_DIR="")
    log = sweep_dir + ".log"
    started = time.monotonic()
    with open(log, "wb") as f:
        rc = subprocess.run(PIN_OTHERS + argv, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=3600).returncode
    result = {"exit_code": rc, "wall_s": time.monotonic() - started, "log": log}
    path = os.path.join(sweep_dir, "matrix.json")
    if os.path.exists(path):
        with open(path) as f:
            result["matrix"] = json.load(f)
    return result


def sweep_cells(matrix):
    """One row per decode cell of the sweep's matrix document (schema tokentap.matrix/v1)."""
    rows = []
    for cell in (matrix or {}).get("decode", []):
        rows.append(
            {
                "context": cell.get("context_tokens"),
                "concurrency": cell.get("concurrency"),
                "status": cell.get("status"),
                "per_request_tps": cell.get("per_request_tok_s"),
                "ttft_ms": cell.get("ttft_ms"),
                "tbt_ms": cell.get("tbt_ms"),
                "average_active_requests": cell.get("average_active_requests"),
                # The server's own state beside the cell (tokentap scrapes the engine's /metrics).
                "server_running": (cell.get("server_state") or {}).get("running_requests"),
                "server_queued": (cell.get("server_state") or {}).get("queued_requests"),
                "server_kv_usage": (cell.get("server_state") or {}).get("kv_cache_usage"),
                "server_prefix_hits": (cell.get("server_state") or {}).get("prefix_cache_hit_rate"),
            }
        )
    return rows


def server_state_check(cells, has_metrics):
    """Issue 13, point 4 against a live engine: with known metrics (vLLM) every Valid cell carries
    the server's running and queued means, and running is within a request of the cell's average
    active requests (the sweep is the engine's only traffic); without (llama.cpp) none is filled in."""
    valid = [c for c in cells if c.get("status") == "Valid"]
    if not valid:
        return {"ok": None, "why": "no Valid cell"}
    if not has_metrics:
        stray = [c for c in valid if c.get("server_running") is not None]
        return {"ok": not stray, "why": "no known metrics: every cell without server state"}
    missing = [c for c in valid if c.get("server_running") is None or c.get("server_queued") is None]
    far = [
        c for c in valid
        if c.get("server_running") is not None and c.get("average_active_requests") is not None
        and abs(c["server_running"] - c["average_active_requests"]) > 1.0
    ]
    return {
        "ok": not missing and not far,
        "why": f"{len(missing)} Valid cells without server state, {len(far)} with |running - average active| > 1",
    }


# ---------------------------------------------------------------------------------------------
# Report


def machine_facts():
    facts = {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    facts["cpu"] = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as f:
            facts["mem_gib"] = round(int(f.readline().split()[1]) / 1024 / 1024, 1)
        facts["loadavg_at_start"] = os.getloadavg()
    except OSError:
        pass
    return facts


def fmt(x, digits=3):
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "**no**"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def render_markdown(results):
    out = [f"# Conformance run {results['started']}", ""]
    m = results["machine"]
    out.append(f"Machine: {m.get('cpus')} vCPU ({m.get('cpu', '?')}), {m.get('mem_gib', '?')} GiB, {m.get('platform')}; "
               f"load average at start {m.get('loadavg_at_start')}. tokentap {results.get('tokentap_version')} "
               f"({results.get('tokentap_commit')})."
               + (" Pinned (`--pin`): vLLM's compute thread on core 1, everything else on core 0." if results.get("pinned") else ""))
    out.append("")
    for key, eng in results["engines"].items():
        out.append(f"## {eng.get('label', key)} {eng.get('version', '')}")
        out.append("")
        if "error" in eng:
            out.append(f"Failed: `{eng['error']}`")
            out.append("")
        if eng.get("cases"):
            out.append("### Plain requests: client's bytes through tokentap vs direct")
            out.append("")
            out.append("| case | status d/t/u | bytes equal | engine framed alike (attempts) | difference (through vs direct) | engine's answer changes with injected usage | usage (prompt/completion) |")
            out.append("|---|---|---|---|---|---|---|")
            for c in eng["cases"]:
                u = c.get("usage") or {}
                out.append(
                    f"| {c['case']} | {'/'.join(map(str, c['status']))} | {fmt(c['bytes_equal'])} | {fmt(c['engine_deterministic'])} ({c.get('attempts')}) | "
                    f"{c['difference'] or ''} | {c.get('engine_changes_with_usage') or ''} | {u.get('prompt_tokens', '–')}/{u.get('completion_tokens', '–')} |"
                )
            out.append("")
        probes = [p for p in (eng.get("ttft_probe"), eng.get("ttft_probe_c4")) if p]
        if probes:
            out.append("### What tokentap adds to the first event")
            out.append("")
            out.append("Rounds of simultaneous streamed chat requests (`max_tokens` 4), direct and through alternating round by round; client time to the first SSE event.")
            out.append("")
            out.append("| requests at once | rounds | median direct (ms) | median through (ms) | median of per-round differences (ms) | within 1 ms |")
            out.append("|---|---|---|---|---|---|")
            for p in probes:
                out.append(f"| {p.get('concurrency', 1)} | {p.get('rounds', p.get('pairs'))} | {fmt(p['direct_median_ms'])} | {fmt(p['through_median_ms'])} | **{fmt(p['added_median_ms'])}** | {fmt(p['within_1ms'])} |")
            out.append("")
        abba = eng.get("client_ttft")
        if isinstance(abba, dict):  # results of a run before the ttft part took several concurrencies
            abba = [abba]
        if abba:
            out.append("### What tokentap adds to a real client's median TTFT")
            out.append("")
            out.append(f"`vllm bench serve`, {abba[0]['prompts']} requests of {abba[0]['input_len']} in / {abba[0]['output_len']} out per run, "
                       "runs in the order direct, through, through, direct (a linear load drift cancels).")
            out.append("")
            out.append("| concurrency | client median TTFT per run (ms) | direct (mean of 2) | through (mean of 2) | added | within 1 ms |")
            out.append("|---|---|---|---|---|---|")
            for ct in abba:
                if "error" in ct:
                    out.append(f"| {ct.get('concurrency', 1)} | failed: {ct['error']} | | | | |")
                    continue
                medians = " / ".join(f"{r['label']} {fmt((r['client'] or {}).get('median_ttft_ms'), 2)}" for r in ct["runs"])
                out.append(f"| {ct.get('concurrency', 1)} | {medians} | {fmt(ct['direct_median_ms'], 2)} | {fmt(ct['through_median_ms'], 2)} | **{fmt(ct['added_ms'], 2)}** | {fmt(ct['within_1ms'])} |")
            out.append("")
        for bname, pair in (eng.get("bench") or {}).items():
            ch = pair.get("checks", {})
            out.append(f"### {bname}")
            out.append("")
            if "error" in ch:
                out.append(f"Failed: {ch['error']}")
                out.append("")
                continue
            d, t = pair["direct"]["client"], pair["through"]["client"]
            out.append("| figure | value | bar | met |")
            out.append("|---|---|---|---|")
            # At this load a request's TTFT is mostly its wait for the others' steps and moves
            # between back-to-back runs by more than a proxy could add: reported, not judged
            # (part `ttft` judges what tokentap adds).
            out.append(f"| client median TTFT direct / through (ms) | {fmt(d.get('median_ttft_ms'))} / {fmt(t.get('median_ttft_ms'))} ({fmt(ch.get('ttft_median_added_ms'))} ms) | (info: judged in part ttft) | |")
            if "ttft_outside_engine_added_ms" in ch:
                out.append(f"| client mean TTFT − engine mean TTFT, direct / through (ms) | {fmt(ch.get('ttft_outside_engine_direct_ms'))} / {fmt(ch.get('ttft_outside_engine_through_ms'))} ({fmt(ch['ttft_outside_engine_added_ms'])} ms) | (info) | |")
            if "engine_ttft_mean_ms" in ch:
                out.append(f"| mean TTFT engine ≤ tokentap ≤ client (ms) | {fmt(ch.get('engine_ttft_mean_ms'))} ≤ {fmt(ch.get('tokentap_ttft_mean_ms'))} ≤ {fmt(ch.get('client_ttft_mean_ms'))} | ordered | {fmt(ch.get('tokentap_ttft_between_engine_and_client'))} |")
            else:
                out.append(f"| mean TTFT tokentap / client (ms) | {fmt(ch.get('tokentap_ttft_mean_ms'))} / {fmt(ch.get('client_ttft_mean_ms'))} | tokentap ≤ client | {fmt((ch.get('tokentap_ttft_mean_ms') or 0) <= (ch.get('client_ttft_mean_ms') or 0))} |")
            out.append(f"| tokentap TBT mean ÷ client TPOT mean | {fmt(ch.get('tbt_over_client_tpot'), 4)} | within 2 % | {fmt(ch.get('tbt_within_2pct'))} |")
            if "itl_over_engine" in ch:
                out.append(f"| tokentap ITL mean ÷ engine ITL mean (samples {fmt(ch.get('tokentap_itl_count'))} vs {fmt(ch.get('engine_itl_count'))}) | {fmt(ch.get('itl_over_engine'), 4)} ({fmt(ch.get('tokentap_itl_mean_ms'))} / {fmt(ch.get('engine_itl_mean_ms'))} ms) | within 2 % | {fmt(ch.get('itl_within_2pct_of_engine'))} |")
                out.append(f"| tokentap TBT mean ÷ engine TPOT mean | {fmt(ch.get('tbt_over_engine_tpot'), 4)} | (info) | |")
            out.append(f"| tokentap ITL mean ÷ client ITL mean | {fmt(ch.get('itl_over_client'), 4)} ({fmt(ch.get('tokentap_itl_mean_ms'))} / {fmt(ch.get('client_itl_mean_ms'))} ms) | (info: clients count per chunk) | |")
            out.append(f"| output tokens tokentap / client{' / engine' if 'engine_generation_tokens' in ch else ''} | {fmt(ch.get('tokentap_completion_tokens'))} / {fmt(ch.get('client_output_tokens'))}{' / ' + fmt(ch.get('engine_generation_tokens')) if 'engine_generation_tokens' in ch else ''} | exact | {fmt(ch.get('output_tokens_exact'))} |")
            out.append(f"| requests tokentap ok / client completed | {fmt((pair['through'].get('tokentap') or {}).get('requests_ok'))} / {fmt(t.get('completed'))} | exact | {fmt(ch.get('requests_exact'))} |")
            out.append("")
        sw = eng.get("sweep")
        if sw:
            out.append("### tokentap sweep --target" + (" (default prompt mode)" if "--prompt" not in sw.get("command", "") else ""))
            out.append("")
            out.append(f"`{sw.get('command', '')}`: exit {sw.get('exit_code')}, {fmt(sw.get('wall_s'), 0)} s.")
            out.append("")
            if sw.get("cells"):
                out.append("Per-request tok/s of a one-cell sweep against `vllm bench serve` run right after it at the same prompt length and concurrency (1000 ÷ median TPOT): "
                           "with the client's random prompts (every prefill a cache miss), and with a shared prefix of all but "
                           f"{PAIR_UNSHARED_TOKENS} tokens (the prefix-cache hits the sweep's repeated prompt gets). "
                           "The engine's own mean ITL over each run tells a measuring difference from the engine running at another speed: "
                           "each tool's tok/s × the engine's ITL over the same run is 1 when the tool reads the engine's own speed.")
                out.append("")
                out.append("| context | concurrency | status | per-request tok/s | one-cell sweep: status, tok/s | client, random prompts: tok/s (ratio) | client, shared prefix: tok/s | ratio | within 10 % | engine's mean ITL: sweep / random / shared (ms) | tok/s × engine ITL: sweep / random / shared |")
                out.append("|---|---|---|---|---|---|---|---|---|---|---|")

                def against_engine(tps, itl_ms):
                    return tps * itl_ms / 1000 if tps and itl_ms else None

                for c in sw["cells"]:
                    agree = " / ".join(
                        fmt(against_engine(c.get(t), c.get(i)), 3)
                        for t, i in (("pair_tps", "engine_itl_ms_sweep"), ("bench_tps", "engine_itl_ms_bench"), ("bench_shared_tps", "engine_itl_ms_bench_shared"))
                    )
                    out.append(f"| {c['context']} | {c['concurrency']} | {c['status']} | {fmt(c.get('per_request_tps'), 1)} | {c.get('pair_status') or '–'}, {fmt(c.get('pair_tps'), 1)} | {fmt(c.get('bench_tps'), 1)} ({fmt(c.get('ratio'), 3)}) | {fmt(c.get('bench_shared_tps'), 1)} | {fmt(c.get('ratio_shared'), 3)} | {fmt(c.get('within_10pct'))} | {fmt(c.get('engine_itl_ms_sweep'), 2)} / {fmt(c.get('engine_itl_ms_bench'), 2)} / {fmt(c.get('engine_itl_ms_bench_shared'), 2)} | {agree} |")
                out.append("")
                out.append("The server's own state per cell (scraped from the engine's /metrics by tokentap):")
                out.append("")
                out.append("| context | concurrency | status | average active | server running | server queued | KV-cache usage | prefix-cache hits |")
                out.append("|---|---|---|---|---|---|---|---|")
                for c in sw["cells"]:
                    out.append(f"| {c['context']} | {c['concurrency']} | {c['status']} | {fmt(c.get('average_active_requests'), 2)} | {fmt(c.get('server_running'), 2)} | {fmt(c.get('server_queued'), 2)} | {fmt(c.get('server_kv_usage'), 3)} | {fmt(c.get('server_prefix_hits'), 3)} |")
                check = sw.get("server_state_check")
                if check:
                    out.append("")
                    out.append(f"Server state per cell: {fmt(check.get('ok'))} ({check.get('why')}).")
                out.append("")
            elif sw.get("error"):
                out.append(f"Failed: {sw['error']}")
                out.append("")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------


def tokentap_version(binary, repo):
    v = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip()
    c = subprocess.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    return v, c


# The route fixture of each engine the harness drives (tests/fixtures/engines/routes/), the venv
# that has the engine installed, and the flags and environment that add optional routes.
ROUTE_CHECKS = {
    "sglang": ("venv-sglang-server", "sglang-0.5.23.tsv", ["--env", "DUMPER_SERVER_PORT=reuse", "--args", "--enable-metrics"]),
    "vllm": (
        "venv-vllm",
        "vllm-0.32.tsv",
        ["--env", "VLLM_SERVER_DEV_MODE=1", "--env", "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1"],
    ),
}


def check_routes(key, home, repo):
    """Runs conformance/routes.py --check in the engine's venv: fails naming every route the
    engine registers that its fixture (and so the engine home, which engine_tests holds to it)
    does not classify. llama.cpp's server is not a FastAPI app of the pinned version: skipped."""
    if key not in ROUTE_CHECKS:
        return
    venv, fixture, extra = ROUTE_CHECKS[key]
    python = os.path.join(home, venv, "bin", "python")
    argv = [python, os.path.join(repo, "conformance", "routes.py"), key, "--check",
            os.path.join(repo, "tests", "fixtures", "engines", "routes", fixture)] + extra
    print(f"[{key}] checking the engine's own routes against {fixture}", flush=True)
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{key} registers routes tokentap does not classify:\n{done.stdout}{done.stderr[-2000:]}")


def main():
    # A SIGTERM stops the run through the finally blocks, so engines and proxies are stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--render", metavar="RESULTS_JSON", help="only recompute the checks of a results.json and print its tables")
    ap.add_argument("--home", help="where install.sh put the venvs and make_model.py the model")
    ap.add_argument("--repo")
    ap.add_argument("--binary", help="the tokentap release binary")
    ap.add_argument("--out", help="results directory")
    ap.add_argument("--engines", default="vllm,llamacpp")
    ap.add_argument(
        "--parts", default=None,
        help="any of cases, bench, ttft (vllm bench serve one at a time, direct/through/through/direct), "
        "sweep, pairs (one-cell sweeps each followed by vllm bench serve); default: all of them, "
        "less an engine's default_skip (sglang's fake scheduler: pairs)",
    )
    ap.add_argument("--attach", action="store_true", help="use engines already serving on their ports")
    ap.add_argument("--no-fixtures", action="store_true", help="do not write tests/fixtures/engines")
    ap.add_argument("--bench-prompts", type=int)
    ap.add_argument("--bench-concurrency", type=int)
    ap.add_argument("--bench-input", type=int)
    ap.add_argument("--bench-output", type=int)
    ap.add_argument("--sweep-contexts")
    ap.add_argument("--sweep-concurrency")
    ap.add_argument("--sweep-cell-duration")
    ap.add_argument("--sweep-max-output", type=int)
    ap.add_argument("--ttft-prompts", type=int, help="requests per run of the ttft part")
    ap.add_argument("--ttft-concurrency", help="concurrencies of the ttft part, e.g. 1,4")
    ap.add_argument(
        "--pin", action="store_true",
        help="vLLM's compute thread on core 1, everything else (its engine core and API server, "
        "tokentap, the clients) on core 0, so a client's CPU work cannot slow the engine it measures",
    )
    ap.epilog = "Load flags left out take the engine's defaults (LOAD_DEFAULTS, Engine.load_defaults)."
    ap.add_argument("--sweep-prompt", default=None, help="token-ids, text or auto; default: tokentap's default")
    args = ap.parse_args()
    if args.pin:
        global PIN_OTHERS, PIN_ENGINE_CORE
        PIN_OTHERS = ["taskset", "-c", "0"]
        PIN_ENGINE_CORE = "1"

    if args.render:
        with open(args.render) as f:
            results = json.load(f)
        for eng in results["engines"].values():
            for pair in (eng.get("bench") or {}).values():
                if "direct" in pair and "through" in pair:
                    pair["checks"] = bench_checks(pair, "engine" in pair["through"])
        print(render_markdown(results))
        return
    if not all((args.home, args.repo, args.binary, args.out)):
        ap.error("--home, --repo, --binary and --out are required (or --render)")
    os.makedirs(args.out, exist_ok=True)
    logs = os.path.join(args.out, "logs")
    os.makedirs(logs, exist_ok=True)
    all_parts = {"cases", "bench", "ttft", "sweep", "pairs"}
    chosen = set(args.parts.split(",")) if args.parts else None
    tv, tc = tokentap_version(args.binary, args.repo)
    results = {
        "started": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "pinned": bool(args.pin),
        "machine": machine_facts(),
        "tokentap_version": tv,
        "tokentap_commit": tc,
        "engines": {},
    }
    fixture_root = os.path.join(args.repo, "tests", "fixtures", "engines")
    today = datetime.date.today().isoformat()

    def save():
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(results, f, indent=2)
        with open(os.path.join(args.out, "results.md"), "w") as f:
            f.write(render_markdown(results))

    for key in args.engines.split(","):
        cls, port = ENGINES[key]
        engine = cls(key, args.home, port, logs)
        eng = results["engines"].setdefault(key, {"label": cls.label})
        tap = None
        try:
            # Before anything runs: the engine's own application lists no route the engine
            # home does not classify (tokentap's route policy fails closed on the rest).
            check_routes(key, args.home, args.repo)
            print(f"[{key}] starting the engine", flush=True)
            if args.attach:
                engine.attach()
            else:
                # A leftover server on the port would answer the readiness check in place of
                # the one being started, and everything after would measure it instead.
                for busy in (engine.port, port + 1, port + 2):
                    if port_in_use(busy):
                        raise RuntimeError(f"port {busy} is in use: stop what listens there or use --attach")
                engine.start()
            eng["version"] = engine.version
            eargs = engine_args(args, engine)
            parts = chosen if chosen is not None else all_parts - engine.default_skip
            tap = Tokentap(
                args.binary, engine.url, port + 1, port + 2, logs, f"tokentap-{key}", engine.tokentap_env
            )
            # After every step whose clients go through the tap: did tokentap refuse any of them?
            watch = RefusalWatch(tap)
            if "cases" in parts:
                print(f"[{key}] plain requests on every metered route", flush=True)
                root = os.path.join(args.out, "fixtures") if args.no_fixtures else fixture_root
                eng["cases"] = run_cases(engine, tap, root, today)
                watch.check("cases", eng)
                save()
            if "bench" in parts:
                print(f"[{key}] TTFT probe: one request at a time, direct and through alternating", flush=True)
                eng["ttft_probe"] = ttft_probe(engine, tap, 100, 1)
                save()
                eng["ttft_probe_c4"] = ttft_probe(engine, tap, 30, 4)
                watch.check("TTFT probe", eng)
                save()
                eng["bench"] = {}
                load = dict(
                    input_len=eargs.bench_input, output_len=eargs.bench_output,
                    prompts=eargs.bench_prompts, concurrency=eargs.bench_concurrency, seed=1,
                    extra_body=engine.bench_extra_body(eargs.bench_output),
                )
                print(f"[{key}] vllm bench serve direct and through", flush=True)
                name = f"vllm bench serve, chat, {eargs.bench_prompts} requests, concurrency {eargs.bench_concurrency}, {eargs.bench_input} in / {eargs.bench_output} out"
                eng["bench"][name] = bench_pair(
                    engine, tap, lambda **kw: run_vllm_bench(args.home, **kw), args.out, **load
                )
                watch.check("vllm bench serve", eng)
                save()
                for backend in engine.sglang_backends:
                    print(f"[{key}] sglang serving benchmark ({backend}) direct and through", flush=True)
                    name = f"sglang.benchmark.serving ({backend}: {SGLANG_BACKEND_ROUTES.get(backend, '')}), {eargs.bench_prompts} requests, concurrency {eargs.bench_concurrency}, {eargs.bench_input} in / {eargs.bench_output} out"
                    eng["bench"][name] = bench_pair(
                        engine, tap,
                        lambda backend=backend, **kw: run_sglang_bench(args.home, backend=backend, **kw),
                        args.out, **load,
                    )
                    watch.check(f"sglang.benchmark.serving ({backend})", eng)
                    save()
            if "ttft" in parts:
                eng["client_ttft"] = []
                for c in (int(x) for x in eargs.ttft_concurrency.split(",")):
                    print(f"[{key}] vllm bench serve at concurrency {c}: direct, through, through, direct", flush=True)
                    eng["client_ttft"].append(client_ttft_abba(
                        engine, tap, args.home, args.out, eargs.ttft_prompts, c, engine.bench_extra_body(4)
                    ))
                    watch.check(f"vllm bench serve, TTFT at concurrency {c}", eng)
                    save()
            if "sweep" in parts:
                print(f"[{key}] tokentap sweep --target", flush=True)
                contexts = [int(x) for x in eargs.sweep_contexts.split(",")]
                conc = [int(x) for x in eargs.sweep_concurrency.split(",")]
                sw = run_sweep(
                    args.binary, engine, args.out, contexts, conc, eargs.sweep_cell_duration,
                    eargs.sweep_max_output, eargs.sweep_prompt,
                )
                sw["command"] = (
                    f"tokentap sweep --target {engine.url} --contexts {eargs.sweep_contexts} --concurrency "
                    f"{eargs.sweep_concurrency} --cell-duration {eargs.sweep_cell_duration} --max-output {eargs.sweep_max_output}"
                    + (f" --prompt {eargs.sweep_prompt}" if eargs.sweep_prompt else "")
                )
                sw["cells"] = sweep_cells(sw.get("matrix"))
                sw["server_state_check"] = server_state_check(
                    sw["cells"], engine.has_metrics and engine.has_server_state
                )
                sw["notes"] = ((sw.get("matrix") or {}).get("metadata") or {}).get("notes", [])
                eng["sweep"] = sw
                save()
                if "pairs" in parts and sw["cells"]:
                    # Per-request tok/s against `vllm bench serve`: the machine's load drifts over
                    # minutes, so each Valid cell is measured again as a one-cell sweep and the
                    # client runs right after it at the same prompt length and concurrency.
                    print(f"[{key}] one-cell sweeps, each followed by vllm bench serve", flush=True)
                    for row in sw["cells"]:
                        if row.get("status") != "Valid":
                            continue
                        ctx, c = row["context"], row["concurrency"]
                        e0 = scrape(engine.port) if engine.has_metrics else ""
                        one = run_sweep(
                            args.binary, engine, args.out, [ctx], [c], eargs.sweep_cell_duration,
                            eargs.sweep_max_output, eargs.sweep_prompt, tag=f"{ctx}-c{c}",
                        )
                        cell = next(iter(sweep_cells(one.get("matrix"))), {})
                        e1 = scrape(engine.port) if engine.has_metrics else ""

                        def client(label, input_len, prompts, seed, prefix_len=0):
                            return run_vllm_bench(
                                args.home, port=engine.port, label=label, out_dir=args.out,
                                input_len=input_len, output_len=eargs.sweep_max_output,
                                prompts=prompts, concurrency=c, seed=seed, route="completions",
                                extra_body=engine.bench_extra_body(eargs.sweep_max_output),
                                prefix_len=prefix_len,
                            )

                        r = client("sweepcell", ctx, max(2 * c, 4), 100 + c)
                        e2 = scrape(engine.port) if engine.has_metrics else ""
                        # The same client with the sweep's cache state: the sweep's streams
                        # repeat one prompt, so all its full KV blocks are prefix-cache hits and
                        # a request's prefill barely slows the others' decode; the client's
                        # random prompts are all misses. A shared prefix of all but 16 tokens
                        # (warmed by one request) gives the client the same hits.
                        shared = client(
                            "sweepcell-shared", PAIR_UNSHARED_TOKENS, max(4 * c, 8), 300 + c,
                            prefix_len=ctx - PAIR_UNSHARED_TOKENS,
                        )
                        e3 = scrape(engine.port) if engine.has_metrics else ""
                        if engine.has_metrics:
                            # The engine's own inter-token latency during each half: tells a
                            # measuring difference from the engine running at another speed.
                            row["engine_itl_ms_sweep"] = hist_mean_ms(e0, e1, engine.metric_names["itl"])
                            row["engine_itl_ms_bench"] = hist_mean_ms(e1, e2, engine.metric_names["itl"])
                            row["engine_itl_ms_bench_shared"] = hist_mean_ms(e2, e3, engine.metric_names["itl"])
                        tpot = (r or {}).get("median_tpot_ms")
                        row["pair_status"] = cell.get("status")
                        row["pair_tps"] = cell.get("per_request_tps")
                        row["bench_tps"] = 1000.0 / tpot if tpot else None
                        row["ratio"] = ratio(row["pair_tps"], row["bench_tps"])
                        shared_tpot = (shared or {}).get("median_tpot_ms")
                        row["bench_shared_tps"] = 1000.0 / shared_tpot if shared_tpot else None
                        row["ratio_shared"] = ratio(row["pair_tps"], row["bench_shared_tps"])
                        row["within_10pct"] = row["ratio_shared"] is not None and abs(row["ratio_shared"] - 1) <= 0.10
                        save()
            # Every part measured, then the run fails for this engine if tokentap refused a client.
            RefusalWatch.fail(eng)
        except Exception as e:  # the run goes on with the next engine; the report says what failed
            eng["error"] = f"{type(e).__name__}: {e}"
            print(f"[{key}] failed: {eng['error']}", file=sys.stderr, flush=True)
        finally:
            if tap:
                tap.proc.stop()
            if engine.proc:
                engine.proc.stop()
            save()
    save()
    print(open(os.path.join(args.out, "results.md")).read())
    if any(eng.get("refused") for eng in results["engines"].values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
