#!/usr/bin/env bash
# CPU per request of several compaction-proxy binaries beside nginx (issue 28), in
# interleaved rounds: every target once per round, in an order that rotates, so the
# noise of a shared machine lands on all alike. Each proxy and nginx (one worker) runs
# alone on PROXY_CPU; the mock upstream and wrk run on LOAD_CPU. The CPU is the utime +
# stime delta in /proc/PID/stat over each wrk run. The proxies get a window so large that
# nothing is counted: what is measured is the cost of the path that needs no compaction.
#
#   bench/cpu_ab.sh ROUNDS NAME=BINARY [NAME=BINARY ...]
#
# Prints each round, then per target the medians over rounds (user, system and total µs
# per request, requests per CPU-second and its ratio to nginx's). With LAT_ROUNDS set,
# bench_latency then sends one request at a time through each target (added p50/p99 over
# the mock alone).
#
# Environment: SECS (each wrk run, 4), CONNS (wrk connections, 32), LAT_ROUNDS,
# LAT_REQUESTS (500), PROXY_CPU (0), LOAD_CPU (1), CARGO_TARGET_DIR (the mock upstream and
# bench_latency are built there, in release). Needs wrk, nginx and taskset.
set -euo pipefail
usage() { sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; }
if (($# < 2)) || [[ ! $1 =~ ^[0-9]+$ ]]; then
  usage >&2
  exit 2
fi
rounds=$1
shift
nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)
for tool in wrk "$nginx_bin" taskset; do
  command -v "$tool" >/dev/null || { echo "cpu_ab.sh: $tool not installed" >&2; exit 2; }
done
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# shellcheck source=bench/lib.sh
source bench/lib.sh
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
cargo build --release --quiet --example bench_upstream --example bench_latency
examples=$CARGO_TARGET_DIR/release/examples
proxy_cpu=${PROXY_CPU:-0} load_cpu=${LOAD_CPU:-1}

tmp=$(mktemp -d -t cpu-ab.XXXXXX)
pids=()
# lib.sh's cleanup ends every process in `pids` and removes `$tmp`.
trap cleanup EXIT
trap 'exit 130' INT TERM

cat >"$tmp/body.lua" <<'LUA'
wrk.method = "POST"
wrk.body = [==[{"model":"gpt-4o-mini","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Summarise the benchmark results in two sentences, please."}],"temperature":0.2,"max_tokens":256}]==]
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer sk-bench"
LUA
printf '[[models]]\nmatch = "*"\ncontext_window = 2000000\n' >"$tmp/proxy.toml"

taskset -c "$load_cpu" "$examples/bench_upstream" --threads 1 >"$tmp/mock.log" 2>&1 &
pids+=("$!")
mock_port=$(wait_listening "$tmp/mock.log")

# NAME:PORT:PID of each target; the PID is the process whose CPU is counted.
targets=()
for spec in "$@"; do
  name=${spec%%=*} binary=${spec#*=}
  [[ $name =~ ^[A-Za-z0-9_-]+$ && -x $binary ]] || { echo "cpu_ab.sh: bad target $spec" >&2; exit 2; }
  # Each proxy has a store of its own, empty: one left in ~/.local/state by other runs
  # (checkpoints, learned windows) would change the path measured.
  XDG_STATE_HOME=$tmp/state-$name RUST_LOG=warn taskset -c "$proxy_cpu" "$binary" serve --config "$tmp/proxy.toml" \
    --listen 127.0.0.1:0 --upstream "http://127.0.0.1:$mock_port/v1" >"$tmp/proxy-$name.log" 2>&1 &
  pid=$!
  pids+=("$pid")
  targets+=("$name:$(wait_listening "$tmp/proxy-$name.log"):$pid")
done
nginx_port=$(free_port)
write_nginx_conf "$tmp/nginx" "$nginx_port" "$mock_port"
setsid taskset -c "$proxy_cpu" "$nginx_bin" -e "$tmp/nginx/error.log" -p "$tmp/nginx" \
  -c "$tmp/nginx/nginx.conf" >"$tmp/nginx.log" 2>&1 </dev/null &
master=$!
pids+=("$master")
wait_port "$nginx_port" 10 "$master"
# nginx's one worker serves; its master only waits.
worker=$(pgrep -P "$master" | head -1)
targets+=("nginx:$nginx_port:$worker")

cpu_ticks() { awk '{print $14, $15}' "/proc/$1/stat"; }
ticks=$(getconf CLK_TCK)
count=${#targets[@]}
for ((round = 1; round <= rounds; round++)); do
  for ((i = 0; i < count; i++)); do
    IFS=: read -r name port pid <<<"${targets[(i + round) % count]}"
    read -r user0 system0 < <(cpu_ticks "$pid")
    done_requests=$(taskset -c "$load_cpu" wrk -t1 -c"${CONNS:-32}" -d"${SECS:-4}"s -s "$tmp/body.lua" \
      "http://127.0.0.1:$port/v1/chat/completions" | awk '/requests in/ {print $1}')
    read -r user1 system1 < <(cpu_ticks "$pid")
    awk -v n="$name" -v r="$round" -v q="$done_requests" -v u=$((user1 - user0)) \
      -v s=$((system1 - system0)) -v t="$ticks" 'BEGIN {
        us = 1e6 / t / q
        printf "%s round %d: %d requests, user %.2f us/req, sys %.2f us/req, total %.2f, req per cpu-s %.0f\n",
          n, r, q, u * us, s * us, (u + s) * us, q * t / (u + s) }' | tee -a "$tmp/rounds.txt"
  done
done

echo
echo "| target | user µs/req | system µs/req | total µs/req | requests per CPU-second | ratio to nginx |"
echo "|---|---|---|---|---|---|"
python3 - "$tmp/rounds.txt" <<'PY'
import re, statistics, sys
rounds = {}
line = re.compile(r"(\S+) round \d+: (\d+) requests, user ([\d.]+) us/req, sys ([\d.]+) us/req, total ([\d.]+), req per cpu-s (\d+)")
for text in open(sys.argv[1]):
    if m := line.match(text):
        rounds.setdefault(m[1], []).append([float(x) for x in m.groups()[2:]])
# Each column's median taken separately, as the write-ups in bench/results do.
medians = {name: [statistics.median(column) for column in zip(*rows)] for name, rows in rounds.items()}
nginx = medians["nginx"][3]
for name, (user, system, total, rate) in medians.items():
    print(f"| {name} | {user:.2f} | {system:.2f} | {total:.2f} | {rate:,.0f} | {rate / nginx:.2f}× |")
PY

if [[ -n ${LAT_ROUNDS:-} ]]; then
  args=(--target "direct=127.0.0.1:$mock_port")
  for target in "${targets[@]}"; do
    IFS=: read -r name port _ <<<"$target"
    args+=(--target "$name=127.0.0.1:$port")
  done
  echo
  taskset -c "$load_cpu" "$examples/bench_latency" "${args[@]}" \
    --rounds "$LAT_ROUNDS" --requests "${LAT_REQUESTS:-500}" --warmup 100
fi
