#!/usr/bin/env bash
# A stand-in for the proxy binary that turns economy mode on, for test harnesses that
# write the proxy's TOML themselves with no [compaction] table (the real-client harness
# does: its start_env has no knob for it). Pass this script where the harness expects the
# binary (PROXY=bench/economy_proxy.sh): it appends a [compaction] table with economy on to
# the file given with --config, then execs the real binary with the same arguments, so the
# harness's pid is the proxy's and it stops it as usual.
#
#   ECONOMY_PROXY_BIN     the real binary (default: target/release/compaction-proxy of this checkout)
#   ECONOMY_AGE           economy_age; unset: the proxy's default (4)
#   ECONOMY_BATCH_TOKENS  economy_batch_tokens; unset: the proxy's default (16000)
#
# An eager run (economy acting on most requests of a short session): ECONOMY_AGE=1 ECONOMY_BATCH_TOKENS=2000.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${ECONOMY_PROXY_BIN:-$root/target/release/compaction-proxy}

config=
prev=
for arg in "$@"; do
  if [[ $prev == --config ]]; then config=$arg; fi
  case $arg in --config=*) config=${arg#--config=} ;; esac
  prev=$arg
done
if [[ -z $config ]]; then
  echo "economy_proxy.sh: no --config FILE given" >&2
  exit 2
fi
# A second [compaction] table would make the TOML invalid: refuse rather than guess.
if grep -q '^\[compaction\]' "$config"; then
  echo "economy_proxy.sh: $config already has a [compaction] table" >&2
  exit 2
fi
{
  printf '[compaction]\neconomy = true\n'
  if [[ -n ${ECONOMY_AGE:-} ]]; then printf 'economy_age = %s\n' "$ECONOMY_AGE"; fi
  if [[ -n ${ECONOMY_BATCH_TOKENS:-} ]]; then printf 'economy_batch_tokens = %s\n' "$ECONOMY_BATCH_TOKENS"; fi
} >>"$config"
exec "$bin" "$@"
