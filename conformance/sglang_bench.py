#!/usr/bin/env python3
"""Runs `python -m sglang.benchmark.serving` unchanged, except that its HTTP GETs without a
timeout get one (10 s), and a GET that times out answers 504.

Why: at the end of every run the client asks the server's `/server_info` (for its report's
speculative-decoding and cache lines) with no timeout. sglang answers `/server_info` only after a
round trip to its scheduler, and the conformance harness's fake scheduler
(`sglang_fake_engine.py`) never answers it, so the client would wait forever after its last
request. The measured requests are aiohttp's, not `requests`', and are not touched.
Usage: sglang_bench.py ARGS... (the arguments of sglang.benchmark.serving)
"""
import runpy
import sys

import requests

_get = requests.get


def _bounded_get(url, *args, **kwargs):
    kwargs.setdefault("timeout", 10)
    try:
        return _get(url, *args, **kwargs)
    except requests.exceptions.Timeout:
        response = requests.models.Response()
        response.status_code = 504
        response.url = url
        response._content = b"{}"
        return response


requests.get = _bounded_get
sys.argv = ["sglang.benchmark.serving"] + sys.argv[1:]
runpy.run_module("sglang.benchmark.serving", run_name="__main__", alter_sys=True)
