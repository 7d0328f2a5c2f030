#!/usr/bin/env python3
# Answer TTFT through sglang's own reasoning parser: tokentap's (first answer token − first
# token) against the client's (first `content` chunk − first `reasoning_content` chunk), per
# request, from tokentap's histogram _sum deltas (one request at a time, so each delta is that
# request's exact value).
#
#   PEER_DIR=... SGL_FAKE_VENV=~/.cache/tokentap-conformance/venv-sglang-server \
#   SGL_FAKE_MODEL=~/.cache/tokentap-conformance/models/tiny/hf SGL_FAKE_REASONING_PARSER=qwen3 \
#   FAKE_ENGINE_TEXT='<think>Let me think about this carefully.</think>The answer is 42.' \
#     bash ../shared/peers/sglang_fake_server.sh start          # sglang 0.5.23 on :8005
#   tokentap serve --upstream http://127.0.0.1:8005 --listen 127.0.0.1:18100 --admin 127.0.0.1:19464
#   conformance/answer_ttft.py 127.0.0.1:18100 127.0.0.1:19464 8
#
# The request names a model sglang does not serve ("whatever"): sglang answers any name, and
# tokentap records it under the served one (tiny-llama), which the metric sums below select.
import json, sys, time, urllib.request
proxy, admin = sys.argv[1], sys.argv[2]
runs = int(sys.argv[3]) if len(sys.argv) > 3 else 5
body = json.dumps({"model": "whatever", "stream": True, "max_tokens": 40,
                   "messages": [{"role": "user", "content": "What is the answer?"}]}).encode()
def metric(name):
    text = urllib.request.urlopen(f"http://{admin}/metrics").read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and 'source="production"' in line and 'model="tiny-llama"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total
diffs = []
for i in range(runs):
    a0, t0 = metric("tokentap_time_to_first_answer_token_seconds_sum"), metric("tokentap_time_to_first_token_seconds_sum")
    req = urllib.request.Request(f"http://{proxy}/v1/chat/completions", data=body, headers={"content-type": "application/json"})
    first = answer = None
    with urllib.request.urlopen(req) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: {"):
                continue
            now = time.perf_counter()
            delta = json.loads(line[6:])["choices"][0]["delta"] if json.loads(line[6:])["choices"] else {}
            if first is None and (delta.get("reasoning_content") or delta.get("content")):
                first = now
            if answer is None and delta.get("content"):
                answer = now
    time.sleep(0.3)
    a1, t1 = metric("tokentap_time_to_first_answer_token_seconds_sum"), metric("tokentap_time_to_first_token_seconds_sum")
    ours = (a1 - a0) - (t1 - t0)
    theirs = answer - first
    diffs.append(abs(ours - theirs) * 1000)
    print(f"run {i}: tokentap answer-first {ours*1000:.2f} ms, client {theirs*1000:.2f} ms, |diff| {abs(ours-theirs)*1000:.2f} ms")
print(f"max |diff| {max(diffs):.2f} ms over {runs} runs")
sys.exit(0 if max(diffs) <= 2.0 else 1)
