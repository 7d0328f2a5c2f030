#!/usr/bin/env python3
"""Starts llama-cpp-python's OpenAI server with one change: X-Request-ID is not validated.

The stock server answers 400 with an empty body to any X-Request-ID that is not a UUID
(starlette_context's RequestIdPlugin(validate=True)), and `vllm bench serve` sends `bench-…` ids.
Turning the check off changes nothing else about what the server sends. All arguments are the
server's own (`python -m llama_cpp.server --help`).
"""

import runpy

import starlette_context.plugins as plugins

_original_init = plugins.RequestIdPlugin.__init__


def _init_without_validation(self, *args, **kwargs):
    kwargs["validate"] = False
    _original_init(self, *args, **kwargs)


plugins.RequestIdPlugin.__init__ = _init_without_validation
runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
