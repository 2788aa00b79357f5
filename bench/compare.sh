#!/usr/bin/env bash
# compaction-proxy next to the field (issue 6), side by side on this machine, against
# one fast mock upstream on loopback (examples/bench_upstream.rs):
#
#   direct (the floor) | nginx | LiteLLM proxy | Portkey gateway | crabllm |
#   compaction-proxy (pass-through: a window large enough that nothing is counted) |
#   compaction-proxy-counted (a window that makes it tokenize every request)
#
# and the compaction work itself: compaction-proxy's engine against Hermes Agent's
# ContextCompressor on identical 10k/128k/1M-token conversations.
#
#   bench/compare.sh           install missing peers (pinned, in bench/peers.sh), run
#                              everything (~10 minutes), write
#                              bench/results/compare-YYYY-MM-DD.{md,png} and the
#                              compare section of docs/performance.md
#   bench/compare.sh --smoke   ~1 minute: installs nothing (peers not in the cache are
#                              skipped, no network needed), tiny durations; writes only
#                              bench/results/raw/compare/ (git-ignored)
#   --no-install               a full run with whatever is cached (skips the rest)
#
# Pinning (2 cores): every proxy under test on PROXY_CPU (default 0), one worker each;
# the mock upstream, the load generators (bench_latency, wrk -t1) and the
# compaction timings on LOAD_CPU (default 1). Not for CI beyond --smoke.
#
# Environment: PROXY_CPU, LOAD_CPU, BENCH_CACHE (install cache, default
# ~/.cache/compaction-proxy-bench), CARGO_TARGET_DIR, BENCH_PROFILE (release; `debug`
# reuses the test build, for the CI smoke that only checks the scripts work).

set -euo pipefail

usage() { sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; }

smoke=0 install=1
for arg in "$@"; do
  case "$arg" in
    --smoke) smoke=1 install=0 ;;
    --no-install) install=0 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "compare.sh: unknown argument $arg" >&2; usage >&2; exit 2 ;;
  esac
done

started_at=$(date +%s)
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
profile=${BENCH_PROFILE:-release}
case "$profile" in
  release) build_flags=(--release) ;;
  debug) build_flags=() ;;
  *) echo "compare.sh: BENCH_PROFILE must be release or debug" >&2; exit 2 ;;
esac
bin=$CARGO_TARGET_DIR/$profile
# shellcheck source=bench/peers.sh
source bench/peers.sh

# Durations. Full: about 10 minutes with every peer; each phase is interleaved rounds
# (every target once per round, in a rotating order) so the noise of a shared machine
# lands on all targets alike, and figures are medians over rounds with [min..max].
if ((smoke)); then
  lat_rounds=2 lat_requests=30 lat_warmup=10
  k100_rounds=1 k100_requests=5 m1_rounds=1 m1_requests=2
  sse_rounds=1
  tp_rounds=1 tp_seconds=1 probe_seconds=0.5 fractions="0.5"
  inflight_rounds=1 inflight_seconds=1 inflight_conns="50"
  engine_sizes=10000 engine_seconds=0.2 hermes_repeat=1
else
  # LiteLLM takes tens of ms per request here: 200 requests a round keep it to ~1 min.
  lat_rounds=10 lat_requests=200 lat_warmup=50
  k100_rounds=8 k100_requests=60 m1_rounds=5 m1_requests=12
  sse_rounds=5
  tp_rounds=3 tp_seconds=3 probe_seconds=2 fractions="0.9 0.75 0.6 0.45 0.3 0.15 0.05"
  inflight_rounds=3 inflight_seconds=3 inflight_conns="100 500"
  engine_sizes=10000,128000,1000000 engine_seconds=2 hermes_repeat=5
fi
# The rate search holds p99 under this bound.
p99_bound_ms=5
delay_ms=20

cpus=$(nproc)
proxy_cpu=${PROXY_CPU:-0}
load_cpu=${LOAD_CPU:-1}
if ((cpus < 2)); then proxy_cpu=0 load_cpu=0; fi

log() { printf '[compare %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

skips=()
skip() { # peer reason
  log "SKIP $1: $2"
  skips+=("$1: $2")
}

# --- tools and peers --------------------------------------------------------------------

if ((install)); then
  install_peers
else
  log "installing nothing; peers missing from $BENCH_CACHE are skipped"
fi
nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)
litellm_dir=$BENCH_CACHE/litellm-$LITELLM_VERSION
hermes_dir=$BENCH_CACHE/hermes-$HERMES_VERSION
portkey_dir=$BENCH_CACHE/portkey-$PORTKEY_VERSION
crabllm_bin=$BENCH_CACHE/crabllm-$CRABLLM_VERSION/bin/crabllm

log "building compaction-proxy and the bench examples ($profile)"
nice cargo build "${build_flags[@]}" --quiet --examples --bin compaction-proxy

# Many connections at once for the in-flight phase.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" || true

# shellcheck source=bench/lib.sh
source bench/lib.sh

# --- processes --------------------------------------------------------------------------

tmp=$(mktemp -d -t compare-bench.XXXXXX)
# The proxies keep their state in this run's own folder: a store left in ~/.local/state by
# other runs would change what is measured, and this run must not write there either.
export XDG_STATE_HOME=$tmp/state
raw=bench/results/raw/compare
rm -rf "$raw"
mkdir -p "$raw"
pids=()
trap cleanup EXIT
trap 'exit 130' INT TERM

# Starts a command in its own session (so cleanup can end its whole group), pinned to
# a cpu, output to $tmp/NAME.log; sets $started_pid.
spawn() { # name cpu command...
  local name=$1 cpu=$2
  shift 2
  setsid taskset -c "$cpu" "$@" >"$tmp/$name.log" 2>&1 </dev/null &
  started_pid=$!
  pids+=("$started_pid")
}


# A process and all its descendants.
proc_tree() {
  local pid=$1 child
  echo "$pid"
  for child in $(ps -o pid= --ppid "$pid" 2>/dev/null); do proc_tree "$child"; done
}
# Sum of a /proc/PID/status field (kB) over a process tree.
tree_kb() { # pid field
  local total=0 p v
  for p in $(proc_tree "$1"); do
    v=$(awk -v k="$2:" '$1 == k { print $2 }' "/proc/$p/status" 2>/dev/null || true)
    total=$((total + ${v:-0}))
  done
  echo "$total"
}

# Target registry: name -> port, pid, extra headers ("key: value" lines).
targets=()
declare -A port_of pid_of headers_of
add_target() { # name port pid [header...]
  local name=$1
  targets+=("$name")
  port_of[$name]=$2
  pid_of[$name]=$3
  shift 3
  local h=""
  for header in "$@"; do h+="$header"$'\n'; done
  headers_of[$name]=$h
}

small_body='{"model":"gpt-4o-mini","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Summarise the benchmark results in two sentences, please."}],"temperature":0.2,"max_tokens":256}'
delayed_body='{"model":"gpt-4o-mini","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"bench-delay-ms='$delay_ms' Summarise the benchmark results in two sentences, please."}],"temperature":0.2,"max_tokens":256}'
stream_body='{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Stream, please."}],"max_tokens":256,"stream":true}'

curl_target() { # name body-file [curl args...]: the response body on stdout
  local name=$1 file=$2
  shift 2
  local args=() line
  while IFS= read -r line; do [[ -n $line ]] && args+=(-H "$line"); done <<<"${headers_of[$name]}"
  curl -sS --max-time 30 "${args[@]}" -H 'content-type: application/json' \
    -H 'authorization: Bearer sk-bench' --data-binary "@$file" "$@" \
    "http://127.0.0.1:${port_of[$name]}/v1/chat/completions"
}

# A peer is measured only once it has answered a chat completion through the mock.
check_chat() { # name
  printf '%s' "$small_body" >"$tmp/small.json"
  local out
  out=$(curl_target "$1" "$tmp/small.json" 2>&1 || true)
  [[ $out == *'"choices"'* && $out == *canned* ]] || {
    echo "no chat completion through it: ${out:0:200}"
    return 1
  }
}

log "starting the mock upstream on cpu $load_cpu"
spawn mock "$load_cpu" "$bin/examples/bench_upstream" --threads 1
mock_pid=$started_pid
mock_port=$(wait_listening "$tmp/mock.log") || { cat "$tmp/mock.log" >&2; exit 1; }
mock_url=http://127.0.0.1:$mock_port/v1
add_target direct "$mock_port" "$mock_pid"

# nginx: plain reverse proxy, one worker, keep-alive upstream pool, no buffering.
start_nginx() {
  local port
  port=$(free_port)
  write_nginx_conf "$tmp/nginx" "$port" "$mock_port"
  spawn nginx "$proxy_cpu" "$nginx_bin" -e "$tmp/nginx/error.log" -p "$tmp/nginx" -c "$tmp/nginx/nginx.conf"
  wait_port "$port" 10 "$started_pid" || { skip nginx "did not start: $(tail -n 3 "$tmp/nginx.log")"; return; }
  add_target nginx "$port" "$started_pid"
}

# LiteLLM proxy: one worker, no callbacks or spend logs, the cost map from the package.
start_litellm() {
  [[ -f $litellm_dir/.done ]] || { skip litellm "not installed (see $BENCH_CACHE/logs/litellm.log)"; return; }
  local port
  port=$(free_port)
  cat >"$tmp/litellm.yaml" <<EOF
model_list:
  - model_name: gpt-4o-mini
    litellm_params:
      model: openai/gpt-4o-mini
      api_base: $mock_url
      api_key: sk-bench
litellm_settings:
  telemetry: false
  turn_off_message_logging: true
  set_verbose: false
  json_logs: false
  success_callback: []
  failure_callback: []
  callbacks: []
general_settings:
  disable_spend_logs: true
  disable_error_logs: true
EOF
  spawn litellm "$proxy_cpu" env LITELLM_LOCAL_MODEL_COST_MAP=True LITELLM_LOG=ERROR \
    LITELLM_TELEMETRY=False DISABLE_ADMIN_UI=True \
    "$litellm_dir/bin/litellm" --config "$tmp/litellm.yaml" --host 127.0.0.1 --port "$port" --num_workers 1
  wait_port "$port" 120 "$started_pid" || { skip litellm "did not start: $(tail -n 3 "$tmp/litellm.log")"; return; }
  add_target litellm "$port" "$started_pid"
}

# Portkey's gateway (Node): headless, production mode; the upstream is given per
# request in headers, and 127.0.0.1 must be listed as a trusted custom host.
start_portkey() {
  [[ -f $portkey_dir/.done ]] || { skip portkey "not installed (see $BENCH_CACHE/logs/portkey.log)"; return; }
  command -v node >/dev/null || { skip portkey "node not installed"; return; }
  local port
  port=$(free_port)
  spawn portkey "$proxy_cpu" env NODE_ENV=production TRUSTED_CUSTOM_HOSTS=127.0.0.1 \
    node "$portkey_dir/node_modules/@portkey-ai/gateway/build/start-server.js" --port="$port" --headless
  wait_port "$port" 60 "$started_pid" || { skip portkey "did not start: $(tail -n 3 "$tmp/portkey.log")"; return; }
  add_target portkey "$port" "$started_pid" "x-portkey-provider: openai" "x-portkey-custom-host: $mock_url"
}

start_crabllm() {
  [[ -x $crabllm_bin ]] || { skip crabllm "not installed (see $BENCH_CACHE/logs/crabllm.log)"; return; }
  local port
  port=$(free_port)
  write_crabllm_config "$port" >"$tmp/crabllm.toml"
  spawn crabllm "$proxy_cpu" env RUST_LOG=warn "$crabllm_bin" serve --config "$tmp/crabllm.toml"
  wait_port "$port" 20 "$started_pid" || { skip crabllm "did not start: $(tail -n 3 "$tmp/crabllm.log")"; return; }
  add_target crabllm "$port" "$started_pid"
}

start_compaction_proxy() { # name config-text
  printf '%s' "$2" >"$tmp/$1.toml"
  spawn "$1" "$proxy_cpu" env RUST_LOG=warn "$bin/compaction-proxy" serve --config "$tmp/$1.toml" \
    --listen 127.0.0.1:0 --upstream "$mock_url"
  local port
  port=$(wait_listening "$tmp/$1.log") || { skip "$1" "did not start: $(tail -n 3 "$tmp/$1.log")"; return; }
  add_target "$1" "$port" "$started_pid"
}

# Windows that force the preflight to tokenize a request yet leave it fitting: the
# proxy skips counting when bytes + output budget <= 0.9 x window, and compacts when
# tokens + budget > 0.9 x window, so each body size needs a window between its token
# count and its byte count (200 for the small body, 60k for 100 KB, 600k for 1 MB).
counted_config() { printf '[[models]]\nmatch = "*"\ncontext_window = %s\n' "$1"; }

# crabllm: one OpenAI-compatible provider pointing at the mock; the clients' key
# (sk-bench) as its one API key, in-memory storage, no extensions.
write_crabllm_config() { # port
  cat <<EOF
listen = "127.0.0.1:$1"

[[keys]]
name = "bench"
key = "sk-bench"
models = ["*"]

[providers.mock]
kind = "openai"
base_url = "$mock_url"
api_key = "sk-bench"
models = ["gpt-4o-mini"]
EOF
}

log "starting the peers on cpu $proxy_cpu"
start_nginx
# Pass-through: a 2M-token window, so that even the 1 MB body is proven to fit by its
# length and nothing is parsed or counted (gpt-4o-mini's built-in 128k window would
# make it count, then compact, the 1 MB body of ~200k tokens).
start_compaction_proxy compaction-proxy "$(counted_config 2000000)"
start_compaction_proxy compaction-proxy-counted "$(counted_config 200)"
start_crabllm
start_portkey
start_litellm

# Keep only the peers that answer; note each one's idle memory after one request (lazy
# start-up work, such as LiteLLM's first-request imports, is then included).
measured=()
declare -A idle_kb
for name in "${targets[@]}"; do
  if reason=$(check_chat "$name"); then
    measured+=("$name")
  else
    skip "$name" "$reason"
  fi
done
sleep 1
for name in "${measured[@]}"; do idle_kb[$name]=$(tree_kb "${pid_of[$name]}" VmRSS); done
# The counted instances for the larger bodies (measured in the latency phase only).
start_compaction_proxy cp-counted-100k "$(counted_config 60000)"
start_compaction_proxy cp-counted-1m "$(counted_config 600000)"
have_wrk=1
command -v wrk >/dev/null || { have_wrk=0; skip "throughput and in-flight phases" "wrk not installed (apt-get install wrk)"; }
log "measuring: ${measured[*]}"
loadavg_start=$(cut -d' ' -f1-3 /proc/loadavg)

# --- 1. latency, one request at a time --------------------------------------------------

# bench_latency arguments for a list of targets (with their headers).
latency_targets() {
  local name line
  for name in "$@"; do
    local shown=$name
    case $name in cp-counted-*) shown=compaction-proxy-counted ;; esac
    printf -- '--target\n%s=127.0.0.1:%s\n' "$shown" "${port_of[$name]}"
    while IFS= read -r line; do
      [[ -n $line ]] && printf -- '--header\n%s=%s\n' "$shown" "$line"
    done <<<"${headers_of[$name]}"
  done
}

# Targets that answer a body of this many bytes with 200 (a peer may cap bodies).
answering() { # bytes counted-instance targets...
  local bytes=$1 counted=$2 name out
  shift 2
  python3 -c "import sys,json; n=int(sys.argv[1]); h='{\"model\":\"gpt-4o-mini\",\"messages\":[{\"role\":\"user\",\"content\":\"'; t='\"}],\"max_tokens\":256}'; sys.stdout.write(h + ('Summarise the benchmark results in two sentences, please. ' * (n // 58 + 1))[:max(0, n - len(h) - len(t))] + t)" "$bytes" >"$tmp/body-$bytes.json"
  for name in "$@"; do
    [[ $name == compaction-proxy-counted ]] && name=$counted
    out=$(curl_target "$name" "$tmp/body-$bytes.json" -o /dev/null -w '%{http_code}' 2>&1 || true)
    if [[ $out == 200 ]]; then echo "$name"; else skip "$name ($bytes-byte body)" "answered $out"; fi
  done
}

run_latency() { # label bytes rounds requests warmup counted-instance
  local label=$1 bytes=$2 rounds=$3 requests=$4 warmup=$5 counted=$6
  local list=()
  mapfile -t list < <(answering "$bytes" "$counted" "${measured[@]}")
  log "latency, $label body: ${#list[@]} targets x $rounds rounds x $requests requests"
  local args=()
  mapfile -t args < <(latency_targets "${list[@]}")
  taskset -c "$load_cpu" "$bin/examples/bench_latency" "${args[@]}" --body-bytes "$bytes" \
    --rounds "$rounds" --requests "$requests" --warmup "$warmup" >"$raw/latency-$label.out" ||
    skip "latency-$label" "bench_latency failed: $(tail -n 2 "$raw/latency-$label.out")"
}

run_latency small 0 "$lat_rounds" "$lat_requests" "$lat_warmup" compaction-proxy-counted
run_latency 100k 102400 "$k100_rounds" "$k100_requests" 10 cp-counted-100k
run_latency 1m 1048576 "$m1_rounds" "$m1_requests" 2 cp-counted-1m

# --- 3. streaming -----------------------------------------------------------------------

sse_list=()
printf '%s' "$stream_body" >"$tmp/stream.json"
for name in "${measured[@]}"; do
  curl_target "$name" "$tmp/stream.json" -N >"$tmp/stream-$name.out" 2>&1 || true
  events=$(grep -c '^data:' "$tmp/stream-$name.out" || true)
  if ((events >= 65)); then
    sse_list+=("$name")
  else
    # With whatever the peer logged about it (Portkey logs the exception).
    skip "$name (SSE)" "stream gave $events data events, 65 expected: $(head -c 150 "$tmp/stream-$name.out"); its log: $(grep -m1 -i 'error' "$tmp/$name.log" | head -c 150)"
  fi
done
log "SSE timing: ${#sse_list[@]} targets x $sse_rounds rounds of 64 chunks 20 ms apart"
mapfile -t sse_args < <(latency_targets "${sse_list[@]}")
taskset -c "$load_cpu" "$bin/examples/bench_latency" "${sse_args[@]}" --mode sse \
  --rounds "$sse_rounds" >"$raw/sse.out" || skip sse "bench_latency failed: $(tail -n 2 "$raw/sse.out")"

# --- 2. throughput ----------------------------------------------------------------------

# wrk and bench_latency send the same small chat body, with the peer's headers.
wrk_script() { # name body -> path of a lua script
  local file=$tmp/wrk-$1-$RANDOM.lua line
  {
    echo 'wrk.method = "POST"'
    printf 'wrk.body = [==[%s]==]\n' "$2"
    echo 'wrk.headers["Content-Type"] = "application/json"'
    echo 'wrk.headers["Authorization"] = "Bearer sk-bench"'
    while IFS= read -r line; do
      [[ -n $line ]] && printf 'wrk.headers["%s"] = "%s"\n' "${line%%: *}" "${line#*: }"
    done <<<"${headers_of[$1]}"
  } >"$file"
  echo "$file"
}

# wrk's "1.23ms" / "456.78us" / "1.2s" in microseconds.
to_us() { awk -v v="$1" 'BEGIN { n = v + 0; if (v ~ /us$/) f = 1; else if (v ~ /ms$/) f = 1e3; else if (v ~ /s$/) f = 1e6; else f = 1; printf "%.0f", n * f }'; }

# Closed-loop wrk run; prints "rps p50_us p99_us errors".
wrk_run() { # name connections seconds body
  local script out
  script=$(wrk_script "$1" "$4")
  out=$(taskset -c "$load_cpu" wrk -t1 -c"$2" -d"$3s" --timeout 5s --latency -s "$script" \
    "http://127.0.0.1:${port_of[$1]}/v1/chat/completions" 2>&1 || true)
  echo "$out" >>"$raw/wrk.log"
  local rps p50 p99 errors
  rps=$(awk '/^Requests\/sec:/ { printf "%.0f", $2 }' <<<"$out")
  p50=$(to_us "$(awk '$1 == "50%" { print $2 }' <<<"$out")")
  p99=$(to_us "$(awk '$1 == "99%" { print $2 }' <<<"$out")")
  errors=$(awk '/Non-2xx/ { e += $NF } /Socket errors/ { gsub(",", ""); e += $4 + $6 + $8 + $10 } END { print e + 0 }' <<<"$out")
  echo "${rps:-0} ${p50:-0} ${p99:-0} $errors"
}

# Open-loop run at a fixed rate (bench_latency --mode rate: wrk2-style, latency counts
# from when a request was released, so a stalled server cannot hide its queue);
# prints "achieved_rps p50_us p99_us errors".
rate_run() { # name rate seconds
  local args=() out
  mapfile -t args < <(latency_targets "$1")
  out=$(taskset -c "$load_cpu" "$bin/examples/bench_latency" --mode rate --rate "$2" --seconds "$3" \
    --connections 64 "${args[@]}" 2>&1 || true)
  echo "$out" >>"$raw/rate.log"
  awk '$1 == "RESULT" {
      for (i = 2; i <= NF; i++) { split($i, p, "="); kv[p[1]] = p[2] }
      if (kv["p99_us"] == "NaN") kv["p99_us"] = 1e12
      if (kv["p50_us"] == "NaN") kv["p50_us"] = 1e12
      printf "%d %d %d %d\n", kv["achieved_rps"], kv["p50_us"], kv["p99_us"], kv["errors"]; found = 1 }
    END { if (!found) print "0 0 0 1" }' <<<"$out"
}

# CPU time (user + system, clock ticks) a process and its descendants have used.
tree_ticks() { # pid
  local total=0 p
  for p in $(proc_tree "$1"); do
    # Fields 14 and 15 of /proc/PID/stat, counted after the command name's ")".
    total=$((total + $(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | awk '{ print $12 + $13 }' || echo 0)))
  done
  echo "$total"
}
clk_tck=$(getconf CLK_TCK)

# Per round and target: the closed-loop maximum with wrk (32 connections), with the CPU
# the target used for it (issue 28: requests per CPU-second against nginx's on the
# same pinned core), then fixed rates at falling fractions of it until one holds p99
# under the bound with no errors and is actually delivered (within 3%).
echo -e "round\ttarget\tkind\tparam\trps\tp50_us\tp99_us\terrors" >"$raw/throughput.tsv"
n=${#measured[@]}
((have_wrk)) || tp_rounds=0 inflight_rounds=0
for ((round = 0; round < tp_rounds; round++)); do
  for ((i = 0; i < n; i++)); do
    name=${measured[(i + round) % n]}
    ticks=$(tree_ticks "${pid_of[$name]}")
    read -r rps p50 p99 errors < <(wrk_run "$name" 32 "$tp_seconds" "$small_body")
    ticks=$(($(tree_ticks "${pid_of[$name]}") - ticks))
    # wrk's rate times its duration is the requests it made; over the CPU seconds used.
    per_cpu=$(awk -v r="$rps" -v s="$tp_seconds" -v t="$ticks" -v hz="$clk_tck" \
      'BEGIN { if (t > 0) printf "%d", r * s * hz / t; else print "" }')
    echo -e "$round\t$name\tmax\t32\t$rps\t$p50\t$p99\t$errors" >>"$raw/throughput.tsv"
    echo -e "$round\t$name\tcpu\t\t$per_cpu\t\t\t" >>"$raw/throughput.tsv"
    log "throughput round $((round + 1))/$tp_rounds, $name: closed-loop max $rps requests/s (p99 $p99 µs, $errors errors), ${per_cpu:-?} requests per CPU-second"
    best=0 sustained=0
    # A peer whose median one request at a time is already over the bound cannot hold
    # it at any rate (LiteLLM here): only the highest delivered rate is looked for.
    alone=$(awk -v t="$name" '$1 == "RESULT" { for (i = 2; i <= NF; i++) { split($i, p, "="); kv[p[1]] = p[2] }
      if (kv["target"] == t) printf "%d", kv["p50_us"] }' "$raw/latency-small.out" 2>/dev/null)
    bound_possible=1
    if ((${alone:-0} > p99_bound_ms * 1000)); then
      log "  one request at a time already takes ${alone} µs (median): p99 < ${p99_bound_ms} ms is out of reach"
      bound_possible=0
    fi
    for f in $fractions; do
      rate=$(awk -v r="$rps" -v f="$f" 'BEGIN { printf "%d", r * f }')
      ((rate >= 10)) || break
      read -r got p50 p99 errors < <(rate_run "$name" "$rate" "$probe_seconds")
      echo -e "$round\t$name\tprobe\t$rate\t$got\t$p50\t$p99\t$errors" >>"$raw/throughput.tsv"
      if ((errors == 0)) && awk -v g="$got" -v r="$rate" 'BEGIN { exit !(g >= 0.97 * r) }'; then
        # Delivered: the highest such rate is the sustained one, whatever its p99.
        ((sustained)) || sustained=$rate
        ((bound_possible)) || break
        if ((p99 < p99_bound_ms * 1000)); then
          best=$rate
          break
        fi
      fi
    done
    echo -e "$round\t$name\tbounded\t$p99_bound_ms\t$best\t$p50\t$p99\t$errors" >>"$raw/throughput.tsv"
    echo -e "$round\t$name\tsustained\t\t$sustained\t\t\t" >>"$raw/throughput.tsv"
    log "  highest fixed rate with p99 < ${p99_bound_ms} ms: $best requests/s (highest delivered: $sustained)"
  done
done

# Requests per CPU-second, medians over rounds, against nginx's.
cpu_median() { # target
  awk -F'\t' -v t="$1" '$2 == t && $3 == "cpu" && $5 != "" { print $5 }' "$raw/throughput.tsv" | sort -n |
    awk '{ a[NR] = $1 } END { if (NR) print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}
if ((tp_rounds > 0)); then
  nginx_cpu=$(cpu_median nginx)
  for name in "${measured[@]}"; do
    # direct is the mock itself, on the other core: its CPU is not a proxy's.
    [[ $name == direct ]] && continue
    median=$(cpu_median "$name")
    [[ -n $median ]] || continue
    log "requests per CPU-second, $name: $median (median of $tp_rounds rounds)$(awk -v m="$median" \
      -v g="${nginx_cpu:-0}" 'BEGIN { if (g > 0) printf ", %.2fx nginx", m / g }')"
  done
fi

# In-flight capacity: the 20 ms mock holds every answer, so a peer that keeps C
# requests in flight delivers C / 20 ms; rps x 20 ms is how many it actually held.
for ((round = 0; round < inflight_rounds; round++)); do
  for conns in $inflight_conns; do
    for ((i = 0; i < n; i++)); do
      name=${measured[(i + round) % n]}
      read -r rps p50 p99 errors < <(wrk_run "$name" "$conns" "$inflight_seconds" "$delayed_body")
      echo -e "$round\t$name\tinflight\t$conns\t$rps\t$p50\t$p99\t$errors" >>"$raw/throughput.tsv"
      log "in-flight round $((round + 1))/$inflight_rounds, $conns connections, $name: $rps requests/s (p99 $p99 µs, $errors errors)"
    done
  done
done

# --- 4. memory --------------------------------------------------------------------------

echo -e "target\tidle_kb\tpeak_kb\tprocesses" >"$raw/memory.tsv"
for name in "${measured[@]}"; do
  echo -e "$name\t${idle_kb[$name]}\t$(tree_kb "${pid_of[$name]}" VmHWM)\t$(proc_tree "${pid_of[$name]}" | wc -l)" >>"$raw/memory.tsv"
done
loadavg_end=$(cut -d' ' -f1-3 /proc/loadavg)

# --- 5. compaction work -----------------------------------------------------------------

log "compaction engine: $engine_sizes tokens"
taskset -c "$load_cpu" "$bin/examples/bench_engine" --out-dir "$tmp/conversations" \
  --sizes "$engine_sizes" --seconds "$engine_seconds" >"$raw/engine.out"
if [[ -f $hermes_dir/.done ]]; then
  log "Hermes Agent ContextCompressor on the same conversations"
  taskset -c "$load_cpu" "$hermes_dir/bin/python" bench/hermes_compress.py --repeat "$hermes_repeat" \
    "$tmp"/conversations/session-*.json >"$raw/hermes.out" 2>"$raw/hermes.err" ||
    skip hermes "compressor run failed: $(tail -n 2 "$raw/hermes.err")"
else
  skip hermes "not installed (see $BENCH_CACHE/logs/hermes.log)"
fi

# --- report -----------------------------------------------------------------------------

versions() {
  echo "nginx=$("$nginx_bin" -v 2>&1 | sed 's|.*nginx/||')"
  ((have_wrk)) && echo "wrk=$(wrk -v 2>&1 | head -1 | awk '{ print $2 }')"
  [[ -f $litellm_dir/.done ]] && echo "litellm=$LITELLM_VERSION"
  [[ -f $portkey_dir/.done ]] && echo "portkey=$PORTKEY_VERSION (node $(node --version 2>/dev/null))"
  [[ -x $crabllm_bin ]] && echo "crabllm=$CRABLLM_VERSION"
  [[ -f $hermes_dir/.done ]] && echo "hermes=$HERMES_VERSION"
  echo "rustc=$(rustc -V | awk '{ print $2 }')"
  echo "python=$(python3 -V 2>&1 | awk '{ print $2 }')"
}
{
  echo "smoke=$smoke"
  echo "commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "date=$(date -u +'%Y-%m-%d %H:%M UTC')"
  echo "cpus=$cpus"
  echo "cpu_model=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)"
  echo "kernel=$(uname -sr)"
  echo "memory=$(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)"
  echo "loadavg_start=$loadavg_start"
  echo "loadavg_end=$loadavg_end"
  echo "proxy_cpu=$proxy_cpu"
  echo "load_cpu=$load_cpu"
  echo "p99_bound_ms=$p99_bound_ms"
  echo "seconds=$(($(date +%s) - started_at))"
  echo "durations=latency $lat_rounds x $lat_requests (small), $k100_rounds x $k100_requests (100 KB), $m1_rounds x $m1_requests (1 MB); SSE $sse_rounds rounds; throughput $tp_rounds rounds ($tp_seconds s closed-loop + ${probe_seconds} s per fixed-rate probe); in-flight $inflight_rounds rounds x $inflight_seconds s at $inflight_conns connections"
  versions | sed 's/^/version_/'
  for s in "${skips[@]}"; do echo "skip=$s"; done
} >"$raw/meta.txt"

report_python=python3
[[ -x $hermes_dir/bin/python ]] && report_python=$hermes_dir/bin/python # has matplotlib
if ((smoke)); then
  "$report_python" bench/compare_report.py --raw "$raw" --out "$raw/compare-smoke"
else
  day=$(date -u +%F)
  "$report_python" bench/compare_report.py --raw "$raw" --out "bench/results/compare-$day" --readme docs/performance.md
fi
log "done in $(($(date +%s) - started_at)) s"
