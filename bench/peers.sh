#!/usr/bin/env bash
# Installs the peers that bench/compare.sh measures compaction-proxy against, pinned to
# exact versions, into a cache outside the repository (BENCH_CACHE, default
# ~/.cache/compaction-proxy-bench). Each install is skipped when its result is already
# there; a failed install prints `SKIP peer: reason` and the others go on.
#
#   bench/peers.sh            install whatever is missing (needs the registries)
#   bench/peers.sh --offline  install nothing; only report what is cached
#
# Sourced by bench/compare.sh (which calls install_peers), or run on its own to warm
# the cache before a timed run.

# Pinned versions (looked up on 2026-11-22 with `pip index versions`, `npm view`,
# `cargo info`). Bump them here and say so in the results.
# LiteLLM: 1.104.9 up to 1.109.1 (the newest) require certifi>=2026.10.19, which the
# package index here does not have yet; 1.100.5 does not ask for it and installs.
LITELLM_VERSION=1.100.5
HERMES_VERSION=0.19.0
PORTKEY_VERSION=1.15.2
CRABLLM_VERSION=0.0.25
MATPLOTLIB_VERSION=3.11.2

BENCH_CACHE=${BENCH_CACHE:-$HOME/.cache/compaction-proxy-bench}

peers_log() { printf '[peers %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

# Runs an install step with a time limit, at low priority (the machine is shared),
# logging to $BENCH_CACHE/logs/NAME.log. Returns non-zero on failure or timeout.
peers_step() { # name seconds command...
  local name=$1 limit=$2
  shift 2
  mkdir -p "$BENCH_CACHE/logs"
  peers_log "installing $name (log: $BENCH_CACHE/logs/$name.log)"
  if ! timeout "$limit" nice -n 15 "$@" >"$BENCH_CACHE/logs/$name.log" 2>&1; then
    peers_log "SKIP $name: install failed or took over ${limit}s; last lines:"
    tail -n 5 "$BENCH_CACHE/logs/$name.log" >&2
    return 1
  fi
}

# A venv per Python peer: LiteLLM and Hermes Agent pin conflicting dependencies.
# The venv directory name carries the version, so bumping the pin installs afresh.
install_venv() { # name dir requirement...
  local name=$1 dir=$2
  shift 2
  [[ -f $dir/.done ]] && return 0
  rm -rf "$dir"
  python3 -m venv "$dir" &&
    peers_step "$name" 900 "$dir/bin/pip" install --disable-pip-version-check "$@" &&
    touch "$dir/.done"
}

install_litellm() {
  install_venv litellm "$BENCH_CACHE/litellm-$LITELLM_VERSION" "litellm[proxy]==$LITELLM_VERSION"
}

install_hermes() {
  # matplotlib rides along here: the chart script runs in this venv.
  install_venv hermes "$BENCH_CACHE/hermes-$HERMES_VERSION" \
    "hermes-agent==$HERMES_VERSION" "matplotlib==$MATPLOTLIB_VERSION"
}

install_portkey() {
  local dir=$BENCH_CACHE/portkey-$PORTKEY_VERSION
  [[ -f $dir/.done ]] && return 0
  command -v npm >/dev/null || { peers_log "SKIP portkey: npm not installed"; return 1; }
  mkdir -p "$dir"
  peers_step portkey 600 npm install --prefix "$dir" --no-audit --no-fund --save-exact \
    "@portkey-ai/gateway@$PORTKEY_VERSION" && touch "$dir/.done"
}

install_cargo_tool() { # name version seconds
  local name=$1 version=$2 limit=$3 dir=$BENCH_CACHE/$1-$2
  [[ -x $dir/bin/$name ]] && return 0
  # A target dir of its own, kept so an interrupted build resumes.
  peers_step "$name" "$limit" env CARGO_TARGET_DIR="$BENCH_CACHE/cargo-target" \
    cargo install --quiet --locked --root "$dir" --version "=$version" "$name"
}

install_nginx_wrk() {
  local missing=()
  command -v nginx >/dev/null || [[ -x /usr/sbin/nginx ]] || missing+=(nginx-light)
  command -v wrk >/dev/null || missing+=(wrk)
  ((${#missing[@]})) || return 0
  local sudo=()
  [[ $(id -u) == 0 ]] || sudo=(sudo)
  peers_step apt 600 sh -c "${sudo[*]} apt-get update -qq && DEBIAN_FRONTEND=noninteractive ${sudo[*]} apt-get install -y -qq ${missing[*]}"
}

# Installs everything missing; never fails (a missing peer is skipped later).
install_peers() {
  mkdir -p "$BENCH_CACHE"
  install_nginx_wrk || true
  install_portkey || true
  install_litellm || true
  install_hermes || true
  # The Rust build last and longest; crabllm only "if it builds in reasonable time".
  install_cargo_tool crabllm "$CRABLLM_VERSION" 1500 || true
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  set -euo pipefail
  if [[ ${1:-} != --offline ]]; then install_peers; fi
  for p in litellm-$LITELLM_VERSION hermes-$HERMES_VERSION portkey-$PORTKEY_VERSION \
    crabllm-$CRABLLM_VERSION/bin/crabllm; do
    if [[ -e $BENCH_CACHE/$p ]]; then echo "cached: $p"; else echo "missing: $p"; fi
  done
fi
