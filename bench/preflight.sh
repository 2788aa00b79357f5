#!/usr/bin/env bash
# What the preflight decision costs on the chat path (issue 4): the latency a 100 KB
# chat request gains through compaction-proxy when the model's window is known, next to
# the direct path, one request at a time in interleaved rounds (examples/bench_latency).
#
#   bench/preflight.sh            full run (~1 minute)
#   bench/preflight.sh --smoke    a few seconds, only checks the script works
#
# Targets: `direct` (the mock upstream), `proxy-bytes` (window 128k from the built-in
# table: the body's length alone proves it fits, nothing is tokenised) and
# `proxy-counted` (a configured 40k window: the request is parsed and counted with the
# model's tokenizer before it is forwarded unchanged).
set -euo pipefail

rounds=10 requests=300 warmup=100
if [[ ${1:-} == --smoke ]]; then rounds=2 requests=20 warmup=5; fi

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
bin=$CARGO_TARGET_DIR/release
cargo build --release --quiet --examples --bin compaction-proxy

work=$(mktemp -d)
# The proxies keep their state in this run's own folder: a store left in ~/.local/state by
# other runs would change what is measured, and this run must not write there either.
export XDG_STATE_HOME=$work/state
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

# Starts a program that prints "listening on http://ADDR ..." and echoes ADDR.
start() { # name command...
  local name=$1 out=$work/$1.log
  shift
  "$@" >"$out" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do
    if addr=$(grep -o 'listening on http://[0-9.:]*' "$out" | head -1); then
      echo "${addr#listening on http://}"
      return
    fi
    sleep 0.1
  done
  echo "preflight.sh: $name did not start" >&2
  cat "$out" >&2
  exit 1
}

mock=$(start mock "$bin/examples/bench_upstream" --listen 127.0.0.1:0)
printf '[[models]]\nmatch = "*"\ncontext_window = 40000\n' >"$work/counted.toml"
printf '' >"$work/bytes.toml"
bytes=$(start bytes env RUST_LOG=warn "$bin/compaction-proxy" serve --config "$work/bytes.toml" \
  --listen 127.0.0.1:0 --upstream "http://$mock/v1")
counted=$(start counted env RUST_LOG=warn "$bin/compaction-proxy" serve --config "$work/counted.toml" \
  --listen 127.0.0.1:0 --upstream "http://$mock/v1")

"$bin/examples/bench_latency" --target "direct=$mock" --target "proxy-bytes=$bytes" \
  --target "proxy-counted=$counted" --body-bytes 102400 \
  --rounds "$rounds" --requests "$requests" --warmup "$warmup"
