#!/usr/bin/env bash
# Speed of compaction-proxy's pass-through path on this machine (issue 2, "Speed"):
# the latency it adds one request at a time, its throughput next to nginx on the same
# core budget, SSE chunk timing, and its resident memory. Everything runs on loopback
# against the fast mock upstream in examples/bench_upstream.rs.
#
#   bench/passthrough.sh           full run (~5 minutes), writes
#                                  bench/results/passthrough-YYYY-MM-DD.md
#   bench/passthrough.sh --smoke   ~30-second run that only checks the script works;
#                                  writes bench/results/raw/ (git-ignored)
#
# Needs root or sudo the first time: nginx and wrk come from Debian's packages.
#
# Pinning (2 cores): the proxy under test (compaction-proxy, whose tokio runtime then
# sizes itself to one worker, or nginx with one worker) runs on PROXY_CPU (default 0).
# The load generators (bench_latency, wrk -t1) and the mock upstream share LOAD_CPU
# (default 1), so every proxy gets one whole core and the same load side. The "direct"
# figures (client straight to the mock) therefore run on one core only: they are the
# floor for latency, not a throughput peer.
#
# Environment: PROXY_CPU, LOAD_CPU, WRK_SECONDS, WRK_ROUNDS, WRK_CONNECTIONS override
# the defaults below.

set -euo pipefail

usage() { sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; }

smoke=0
for arg in "$@"; do
  case "$arg" in
    --smoke) smoke=1 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "passthrough.sh: unknown argument $arg" >&2; usage >&2; exit 2 ;;
  esac
done

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
bin=$CARGO_TARGET_DIR/release

if ((smoke)); then
  lat_rounds=3 lat_requests=200 lat_warmup=50
  big_rounds=2 big_requests=30
  sse_rounds=1
  wrk_seconds=${WRK_SECONDS:-2} wrk_rounds=${WRK_ROUNDS:-1} wrk_connections=${WRK_CONNECTIONS:-16}
else
  lat_rounds=20 lat_requests=1000 lat_warmup=300
  big_rounds=10 big_requests=200
  sse_rounds=5
  wrk_seconds=${WRK_SECONDS:-3} wrk_rounds=${WRK_ROUNDS:-5} wrk_connections=${WRK_CONNECTIONS:-"16 64"}
fi

cpus=$(nproc)
proxy_cpu=${PROXY_CPU:-0}
load_cpu=${LOAD_CPU:-1}
if ((cpus < 2)); then
  proxy_cpu=0 load_cpu=0
fi

log() { printf '[passthrough %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

# --- tools ------------------------------------------------------------------------------

as_root() {
  if [[ $(id -u) == 0 ]]; then "$@"; else sudo "$@"; fi
}

apt_updated=0
apt_install() {
  if ((!apt_updated)); then
    as_root apt-get update -qq
    apt_updated=1
  fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

if ! command -v nginx >/dev/null 2>&1 && [[ ! -x /usr/sbin/nginx ]]; then
  log "installing nginx"
  apt_install nginx-light || apt_install nginx
fi
if ! command -v wrk >/dev/null 2>&1; then
  log "installing wrk"
  apt_install wrk
fi
nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)

log "building (release)"
cargo build --release --quiet --examples --bin compaction-proxy

# shellcheck source=bench/lib.sh
source bench/lib.sh

# --- processes --------------------------------------------------------------------------

tmp=$(mktemp -d -t passthrough-bench.XXXXXX)
# The proxies keep their state in this run's own folder: a store left in ~/.local/state by
# other runs would change what is measured, and this run must not write there either.
export XDG_STATE_HOME=$tmp/state
pids=()
trap cleanup EXIT
trap 'exit 130' INT TERM


kb_of() { awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/status"; }
cpu_ticks() { # utime + stime of the given processes
  local total=0 pid stat
  for pid in "$@"; do
    stat=$(<"/proc/$pid/stat")
    stat=${stat##*) }
    read -r -a f <<<"$stat"
    total=$((total + f[11] + f[12]))
  done
  echo "$total"
}

log "starting the mock upstream on cpu $load_cpu"
taskset -c "$load_cpu" "$bin/examples/bench_upstream" --threads 1 >"$tmp/mock.out" 2>&1 &
mock_pid=$!
pids+=("$mock_pid")
mock_port=$(wait_listening "$tmp/mock.out")

start_proxy() { # name level -> sets proxy_pid/proxy_port
  local name=$1 level=$2
  RUST_LOG=$level taskset -c "$proxy_cpu" "$bin/compaction-proxy" serve \
    --listen "127.0.0.1:0" --upstream "http://127.0.0.1:$mock_port/v1" \
    2>"$tmp/$name.log" &
  proxy_pid=$!
  pids+=("$proxy_pid")
  proxy_port=$(wait_listening "$tmp/$name.log")
}

log "starting compaction-proxy (RUST_LOG=warn and RUST_LOG=info) on cpu $proxy_cpu"
start_proxy proxy warn
proxy_pid_warn=$proxy_pid proxy_port_warn=$proxy_port
start_proxy proxy-info info
proxy_pid_info=$proxy_pid proxy_port_info=$proxy_port
sleep 1
idle_rss_kb=$(kb_of "$proxy_pid_warn" VmRSS)
idle_rss_info_kb=$(kb_of "$proxy_pid_info" VmRSS)

log "starting nginx (1 worker) on cpu $proxy_cpu"
nginx_port=$(free_port)
write_nginx_conf "$tmp/nginx" "$nginx_port" "$mock_port"
taskset -c "$proxy_cpu" "$nginx_bin" -e "$tmp/nginx/error.log" -p "$tmp/nginx" -c "$tmp/nginx/nginx.conf" &
nginx_pid=$!
pids+=("$nginx_pid")
wait_port "$nginx_port"
nginx_procs=("$nginx_pid" $(ps -o pid= --ppid "$nginx_pid"))

targets=(
  --target "direct=127.0.0.1:$mock_port"
  --target "compaction-proxy=127.0.0.1:$proxy_port_warn"
  --target "compaction-proxy-info=127.0.0.1:$proxy_port_info"
  --target "nginx=127.0.0.1:$nginx_port"
)
loadavg_start=$(cut -d' ' -f1-3 /proc/loadavg)

# --- latency ----------------------------------------------------------------------------
# Measured twice: under the machine's normal scheduling ("shared": other users' builds
# preempt the proxy, and EEVDF can leave a woken task waiting for a few-ms slice), and
# with every process of the benchmark at SCHED_FIFO priority ("rt"), which keeps other
# users off the measured path and shows the proxy's own cost. The rt phase is short and
# one request at a time, so the kernel's RT throttling is never near; BENCH_RT=0 skips it.

server_pids=("$mock_pid" "$proxy_pid_warn" "$proxy_pid_info" "${nginx_procs[@]}")
sched_modes=(shared)
if [[ ${BENCH_RT:-1} == 1 ]] && chrt -f 10 true 2>/dev/null; then
  sched_modes+=(rt)
fi
set_sched() {
  local pid
  for pid in "${server_pids[@]}"; do
    if [[ $1 == rt ]]; then chrt -a -f -p 50 "$pid" >/dev/null; else chrt -a -o -p 0 "$pid" >/dev/null; fi
  done
}
latency_client() { # mode args...
  local mode=$1
  shift
  if [[ $mode == rt ]]; then
    chrt -f 50 taskset -c "$load_cpu" "$bin/examples/bench_latency" "${targets[@]}" "$@"
  else
    taskset -c "$load_cpu" "$bin/examples/bench_latency" "${targets[@]}" "$@"
  fi
}
# Layouts: "split" is the pinning described at the top (the proxy on its own core), so
# every hop through a proxy crosses cores; in a VM a cross-core wake-up of an idle vCPU
# costs tens of microseconds of hypervisor time that nginx pays alike. "same" moves the
# proxies and nginx onto the load core next to the client and the mock, leaving only
# the proxy's own work and two context switches as the added latency.
set_layout() {
  local cpu=$proxy_cpu pid
  [[ $1 == same ]] && cpu=$load_cpu
  for pid in "$proxy_pid_warn" "$proxy_pid_info" "${nginx_procs[@]}"; do
    taskset -a -p -c "$cpu" "$pid" >/dev/null
  done
}
layouts=(split same)
for layout in "${layouts[@]}"; do
  set_layout "$layout"
  for mode in "${sched_modes[@]}"; do
    set_sched "$mode"
    log "[$layout/$mode] latency, small chat body ($lat_rounds rounds x $lat_requests requests)"
    latency_client "$mode" --rounds "$lat_rounds" --requests "$lat_requests" --warmup "$lat_warmup" \
      >"$tmp/latency-small-$layout-$mode.out"
    log "[$layout/$mode] latency, 100 KB chat body ($big_rounds rounds x $big_requests requests)"
    latency_client "$mode" --body-bytes 102400 --rounds "$big_rounds" --requests "$big_requests" \
      --warmup 20 >"$tmp/latency-100k-$layout-$mode.out"
    if [[ $layout == split ]]; then
      log "[$layout/$mode] SSE timing ($sse_rounds rounds of 64 chunks 20 ms apart)"
      latency_client "$mode" --mode sse --rounds "$sse_rounds" >"$tmp/sse-$mode.out"
    fi
  done
done
set_layout split
set_sched shared

# --- throughput -------------------------------------------------------------------------

cat >"$tmp/post.lua" <<'EOF'
wrk.method = "POST"
wrk.body = '{"model":"gpt-4o-mini","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Summarise the benchmark results in two sentences, please."}],"temperature":0.2,"max_tokens":256}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer sk-bench"
EOF

declare -A port_of=(
  [direct]=$mock_port [compaction-proxy]=$proxy_port_warn
  [compaction-proxy-info]=$proxy_port_info [nginx]=$nginx_port
)
declare -A procs_of=(
  [direct]=$mock_pid [compaction-proxy]=$proxy_pid_warn
  [compaction-proxy-info]=$proxy_pid_info [nginx]="${nginx_procs[*]}"
)
wrk_targets=(direct compaction-proxy compaction-proxy-info nginx)
ticks_per_s=$(getconf CLK_TCK)

# wrk's "1.23ms" / "456.78us" / "1.2s" in microseconds.
to_us() { awk -v v="$1" 'BEGIN { n = v + 0; if (v ~ /us$/) f = 1; else if (v ~ /ms$/) f = 1e3; else if (v ~ /s$/) f = 1e6; else f = 1; printf "%.0f", n * f }'; }

echo -e "round\tconnections\ttarget\trps\tp50_us\tp99_us\terrors\tcpu_us_per_req" >"$tmp/wrk.tsv"
runs=0
for ((round = 0; round < wrk_rounds; round++)); do
  for conns in $wrk_connections; do
    n=${#wrk_targets[@]}
    for ((i = 0; i < n; i++)); do
      target=${wrk_targets[(i + round) % n]}
      log "wrk round $((round + 1))/$wrk_rounds, $conns connections, $target"
      read -r -a procs <<<"${procs_of[$target]}"
      before=$(cpu_ticks "${procs[@]}")
      out="$tmp/wrk-$target-$conns-$round.out"
      taskset -c "$load_cpu" wrk -t1 -c"$conns" -d"${wrk_seconds}s" --latency -s "$tmp/post.lua" \
        "http://127.0.0.1:${port_of[$target]}/v1/chat/completions" >"$out"
      after=$(cpu_ticks "${procs[@]}")
      rps=$(awk '/^Requests\/sec:/ { print $2 }' "$out")
      requests=$(awk '/requests in/ { print $1 }' "$out")
      p50=$(to_us "$(awk '$1 == "50%" { print $2 }' "$out")")
      p99=$(to_us "$(awk '$1 == "99%" { print $2 }' "$out")")
      errors=$(awk '/Non-2xx/ { e += $NF } /Socket errors/ { gsub(",", ""); e += $4 + $6 + $8 + $10 } END { print e + 0 }' "$out")
      cpu=$(awk -v t=$((after - before)) -v hz="$ticks_per_s" -v r="$requests" 'BEGIN { printf "%.1f", (r > 0 ? t * 1e6 / hz / r : 0) }')
      echo -e "$round\t$conns\t$target\t$rps\t$p50\t$p99\t$errors\t$cpu" >>"$tmp/wrk.tsv"
      runs=$((runs + 1))
    done
  done
done

peak_rss_kb=$(kb_of "$proxy_pid_warn" VmHWM)
after_rss_kb=$(kb_of "$proxy_pid_warn" VmRSS)
peak_rss_info_kb=$(kb_of "$proxy_pid_info" VmHWM)
loadavg_end=$(cut -d' ' -f1-3 /proc/loadavg)

# --- report -----------------------------------------------------------------------------

# Median of column $col for rows matching connections/target.
wrk_median() {
  awk -F'\t' -v c="$1" -v t="$2" -v col="$3" 'NR > 1 && $2 == c && $3 == t { print $col }' "$tmp/wrk.tsv" |
    sort -g | awk '{ a[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print a[(NR + 1) / 2]; else printf "%.1f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}
wrk_range() {
  awk -F'\t' -v c="$1" -v t="$2" 'NR > 1 && $2 == c && $3 == t { print $4 }' "$tmp/wrk.tsv" |
    sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%.0f..%.0f", lo, hi }'
}
result() { # mode file target key
  awk -v t="$2" -v k="$3" '$1 == "RESULT" {
      delete kv; for (i = 2; i <= NF; i++) { split($i, p, "="); kv[p[1]] = p[2] }
      if (kv["target"] == t) print kv[k] }' "$1"
}
lt() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 < b + 0) }'; }
yes_no() { if "$@"; then echo "**met**"; else echo "**not met**"; fi; }

declare -A fig
for mode in "${sched_modes[@]}"; do
  for layout in "${layouts[@]}"; do
    f="$tmp/latency-small-$layout-$mode.out"
    fig[$layout.$mode.added_p50]=$(result "$f" compaction-proxy added_p50_us)
    fig[$layout.$mode.added_p99]=$(result "$f" compaction-proxy added_p99_us)
    fig[$layout.$mode.info_added_p99]=$(result "$f" compaction-proxy-info added_p99_us)
    fig[$layout.$mode.nginx_added_p50]=$(result "$f" nginx added_p50_us)
    fig[$layout.$mode.nginx_added_p99]=$(result "$f" nginx added_p99_us)
  done
  fig[$mode.stalls]=$(result "$tmp/sse-$mode.out" compaction-proxy stalls)
  fig[$mode.direct_stalls]=$(result "$tmp/sse-$mode.out" direct stalls)
  fig[$mode.added_mean_gap]=$(result "$tmp/sse-$mode.out" compaction-proxy added_mean_gap_ms)
  fig[$mode.added_max_gap]=$(result "$tmp/sse-$mode.out" compaction-proxy added_max_gap_ms)
  fig[$mode.events]=$(result "$tmp/sse-$mode.out" compaction-proxy events)
done

ratios=() cpu_ratios=() worst_ratio=""
for conns in $wrk_connections; do
  p=$(wrk_median "$conns" compaction-proxy 4)
  g=$(wrk_median "$conns" nginx 4)
  r=$(awk -v p="$p" -v g="$g" 'BEGIN { printf "%.2f", (g > 0 ? p / g : 0) }')
  ratios+=("$conns connections: $r;")
  # Requests per CPU-second relative to nginx: what the ratio would be with both
  # saturating their core, and less swayed by other users' load than requests/s.
  p=$(wrk_median "$conns" compaction-proxy 8)
  g=$(wrk_median "$conns" nginx 8)
  cpu_ratios+=("$conns connections: $(awk -v p="$p" -v g="$g" 'BEGIN { printf "%.2f", (p > 0 ? g / p : 0) }');")
  if [[ -z $worst_ratio ]] || lt "$r" "$worst_ratio"; then worst_ratio=$r; fi
done

latency_met() { lt "${fig[$1.added_p99]}" 100; }  # key: layout.mode
throughput_met() { ! lt "$worst_ratio" 0.8; }
# A stall is a chunk held back by the proxy: Nagle plus a delayed ACK is ~40 ms, so the
# worst gap of a stream must stay within a few ms of the direct stream's in the same
# round, the mean gap within 1 ms, and every event must arrive. Gaps over 30 ms that
# the direct stream shows too are the machine's, not the proxy's; they are counted.
sse_met() {
  [[ ${fig[$1.events]} == 65 ]] &&
    awk -v a="${fig[$1.added_mean_gap]}" -v m="${fig[$1.added_max_gap]}" \
      'BEGIN { exit !(a < 1 && a > -1 && m < 5) }'
}
rss_met() { ((idle_rss_kb < 20480)); }

if ((smoke)); then
  outdir=bench/results/raw
  results=$outdir/passthrough-smoke-$(date -u +%F).md
else
  outdir=bench/results
  results=$outdir/passthrough-$(date -u +%F).md
fi
mkdir -p "$outdir" bench/results/raw
cp "$tmp"/*.out "$tmp/wrk.tsv" bench/results/raw/ 2>/dev/null || true

mib() { awk -v k="$1" 'BEGIN { printf "%.1f MiB", k / 1024 }'; }
strip() { grep -v '^RESULT ' "$1"; }

{
  echo "# compaction-proxy pass-through speed, $(date -u +'%Y-%m-%d %H:%M UTC')"
  echo
  ((smoke)) && echo "**Smoke run: durations far too short for the figures to mean anything.**" && echo
  echo "Produced by \`bench/passthrough.sh\` at commit \`$(git rev-parse --short HEAD 2>/dev/null || echo unknown)\`."
  echo
  echo "## Machine"
  echo
  echo "- CPUs: $cpus ($(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo))"
  echo "- Kernel: $(uname -sr)"
  echo "- Load average at start / end: $loadavg_start / $loadavg_end (the machine is shared; rounds are interleaved and figures are medians over rounds, [min..max] across rounds)"
  echo "- $("$nginx_bin" -v 2>&1), $(wrk -v 2>&1 | head -1 | cut -d' ' -f1-2), $(rustc -V)"
  echo "- Pinning: compaction-proxy (tokio sizes its runtime to the one allowed core) and nginx (1 worker) on cpu $proxy_cpu; the mock upstream (1 thread), the latency client and wrk (1 thread) on cpu $load_cpu (the \"split\" layout; throughput is measured in it only). The \"same\" latency layout moves the proxies and nginx onto cpu $load_cpu too."
  echo "- compaction-proxy runs as \`compaction-proxy serve --listen 127.0.0.1:0 --upstream http://127.0.0.1:MOCK/v1\` with RUST_LOG=warn (\`compaction-proxy\`) and, as a second instance, RUST_LOG=info (\`compaction-proxy-info\`, one log line per request to a file)."
  echo "- nginx: plain reverse proxy, keep-alive upstream pool, proxy_http_version 1.1, proxy_buffering off, proxy_request_buffering off, access log off, 1 worker."
  echo
  echo "## Targets"
  echo
  echo "Latency figures per core layout and scheduling mode. Layout **split**: the proxy (or nginx) on its own core, client and mock on the other, so each proxied request crosses cores four times (in this VM a wake-up across vCPUs costs tens of µs of hypervisor time, paid by nginx alike); **same**: everything on one core, leaving the proxy's own work. Scheduling **shared**: the machine as it is (other users' builds compete for both cores); **rt**: every benchmark process at SCHED_FIFO priority, so that other users' work stays off the measured path."
  echo
  echo "| target | mode | measured | |"
  echo "|---|---|---|---|"
  for layout in "${layouts[@]}"; do
    for mode in "${sched_modes[@]}"; do
      k=$layout.$mode
      echo "| added p99 < 100 µs, one request at a time | $layout, $mode | ${fig[$k.added_p99]} µs (p50 ${fig[$k.added_p50]} µs; at info level p99 ${fig[$k.info_added_p99]} µs; nginx adds p50 ${fig[$k.nginx_added_p50]} µs, p99 ${fig[$k.nginx_added_p99]} µs) | $(yes_no latency_met "$k") |"
    done
  done
  echo "| throughput ≥ 0.8× nginx on the same core | split, shared | requests/s ratio ${ratios[*]} requests per CPU-second ratio ${cpu_ratios[*]} | $(yes_no throughput_met) |"
  for mode in "${sched_modes[@]}"; do
    echo "| no stalls between SSE chunks | split, $mode | added mean gap ${fig[$mode.added_mean_gap]} ms, added max gap ${fig[$mode.added_max_gap]} ms (medians over rounds), ${fig[$mode.events]}/65 events; gaps over 30 ms in all rounds: ${fig[$mode.stalls]} (direct ${fig[$mode.direct_stalls]}) | $(yes_no sse_met "$mode") |"
  done
  echo "| idle RSS < 20 MB | | $(mib "$idle_rss_kb") (peak after load $(mib "$peak_rss_kb")) | $(yes_no rss_met) |"
  echo
  for layout in "${layouts[@]}"; do
    for mode in "${sched_modes[@]}"; do
      echo "## Latency, one request at a time (POST /v1/chat/completions), $layout layout, $mode scheduling"
      echo
      strip "$tmp/latency-small-$layout-$mode.out"
      echo
      strip "$tmp/latency-100k-$layout-$mode.out"
      echo
    done
  done
  for mode in "${sched_modes[@]}"; do
    echo "## SSE (64 chunks 20 ms apart, then \`data: [DONE]\`), $mode scheduling"
    echo
    strip "$tmp/sse-$mode.out"
    echo
  done
  echo "## Throughput (wrk -t1, POST small chat body, ${wrk_seconds} s per run, $wrk_rounds round(s), targets interleaved)"
  echo
  echo "Median over rounds. CPU µs/request is the target's own CPU time (user + system) over the requests it served; for direct it is the mock's."
  echo
  echo "| connections | target | requests/s | range | p50 µs | p99 µs | errors | CPU µs/request |"
  echo "|---|---|---|---|---|---|---|---|"
  for conns in $wrk_connections; do
    for target in "${wrk_targets[@]}"; do
      echo "| $conns | $target | $(wrk_median "$conns" "$target" 4) | $(wrk_range "$conns" "$target") | $(wrk_median "$conns" "$target" 5) | $(wrk_median "$conns" "$target" 6) | $(wrk_median "$conns" "$target" 7) | $(wrk_median "$conns" "$target" 8) |"
    done
  done
  echo
  echo "compaction-proxy / nginx, requests/s: ${ratios[*]} requests per CPU-second (nginx CPU µs/request ÷ compaction-proxy's): ${cpu_ratios[*]}"
  echo
  echo "## Memory (compaction-proxy)"
  echo
  echo "| | RUST_LOG=warn | RUST_LOG=info |"
  echo "|---|---|---|"
  echo "| idle VmRSS after start, before load | $(mib "$idle_rss_kb") | $(mib "$idle_rss_info_kb") |"
  echo "| peak VmHWM after load | $(mib "$peak_rss_kb") | $(mib "$peak_rss_info_kb") |"
  echo "| VmRSS after load | $(mib "$after_rss_kb") | |"
} >"$results"

log "wrote $results"
cat "$results"
