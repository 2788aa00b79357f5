#!/usr/bin/env bash
# Soak (issue 13): compaction-proxy holding many idle keep-alive client connections while
# it serves a steady chat load. Reports the proxy's resident memory, errors, and the
# latency it adds (proxy minus a direct call to the mock, at the same fixed rate)
# before, during and after the idle connections. Not a timed test: run it by hand.
#
#   bench/soak.sh                       10,000 idle connections, 3 minutes of load
#   SOAK_IDLE=2000 SOAK_SECONDS=60 bench/soak.sh
#
# Environment: SOAK_IDLE (idle connections, default 10000), SOAK_SECONDS (load while
# they are held, default 180), SOAK_PHASE_SECONDS (load before and after, per target,
# default 20), SOAK_RATE (chat requests per second, default 200), SOAK_CONNECTIONS
# (keep-alive connections carrying that load, default 16). Every process runs on loopback
# against the mock upstream in examples/bench_upstream.rs; results go to stdout.

set -euo pipefail

idle=${SOAK_IDLE:-10000}
seconds=${SOAK_SECONDS:-180}
phase_seconds=${SOAK_PHASE_SECONDS:-20}
rate=${SOAK_RATE:-200}
connections=${SOAK_CONNECTIONS:-16}

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
bin=$CARGO_TARGET_DIR/release

log() { printf '[soak %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

# Each idle connection is a descriptor in the proxy and one in the holder.
want=$((idle + 1024))
if (($(ulimit -n) < want)); then
  ulimit -n "$want" 2>/dev/null || ulimit -n "$(ulimit -Hn)"
fi
if (($(ulimit -n) < want)); then
  echo "soak.sh: $idle connections need ulimit -n $want; the hard limit is $(ulimit -Hn)" >&2
  exit 1
fi

log "building (release)"
cargo build --release --quiet --examples --bin compaction-proxy

# shellcheck source=bench/lib.sh
source bench/lib.sh

tmp=$(mktemp -d -t soak.XXXXXX)
# The proxies keep their state in this run's own folder: a store left in ~/.local/state by
# other runs would change what is measured, and this run must not write there either.
export XDG_STATE_HOME=$tmp/state
pids=()
# lib.sh's cleanup ends every process in `pids` and removes `$tmp`.
trap cleanup EXIT
trap 'exit 130' INT TERM

"$bin/examples/bench_upstream" --threads 1 >"$tmp/mock.out" 2>&1 &
pids+=($!)
mock_port=$(wait_listening "$tmp/mock.out")

# Idle connections must outlive the soak: the default keep-alive timeout (30 s) would
# close them, which is the proxy doing its job, not what is measured here.
cat >"$tmp/proxy.toml" <<TOML
[server]
keep_alive_timeout_ms = $(((seconds + 120) * 1000))
TOML
RUST_LOG=warn "$bin/compaction-proxy" serve --config "$tmp/proxy.toml" \
  --listen 127.0.0.1:0 --upstream "http://127.0.0.1:$mock_port/v1" 2>"$tmp/proxy.log" &
proxy_pid=$!
pids+=("$proxy_pid")
proxy_port=$(wait_listening "$tmp/proxy.log")

rss_mb() { awk '$1 == "VmRSS:" { printf "%.1f", $2 / 1024 }' "/proc/$proxy_pid/status"; }
# One RSS sample a second, for the peak of each phase.
(while kill -0 "$proxy_pid" 2>/dev/null; do rss_mb >>"$tmp/rss"; echo >>"$tmp/rss"; sleep 1; done) &
pids+=($!)
peak_since() { tail -n +"$1" "$tmp/rss" | sort -n | tail -1; }

load() { # seconds -> RESULT lines for direct and proxy
  "$bin/examples/bench_latency" --mode rate --rate "$rate" --seconds "$1" \
    --connections "$connections" \
    --target "direct=127.0.0.1:$mock_port" --target "proxy=127.0.0.1:$proxy_port" |
    grep '^RESULT'
}
added() { # RESULT lines -> "p50 +A us, p99 +B us, errors E"
  awk '{ for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
         p50[v["target"]] = v["p50_us"]; p99[v["target"]] = v["p99_us"]; e += v["errors"] }
       END { printf "p50 %+d us, p99 %+d us, errors %d", p50["proxy"] - p50["direct"],
             p99["proxy"] - p99["direct"], e }'
}

# Holds `idle` keep-alive connections, each having had one answer, for `hold` seconds;
# then asks for another answer on each and reports how many still gave one.
cat >"$tmp/hold.py" <<'PY'
import asyncio, sys

port, count, hold = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
REQUEST = b"GET /healthz HTTP/1.1\r\nhost: soak\r\n\r\n"

async def ask(reader, writer):
    writer.write(REQUEST)
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(l.split(b":")[1]) for l in head.split(b"\r\n")
                  if l.lower().startswith(b"content-length:"))
    await reader.readexactly(length)
    return head.startswith(b"HTTP/1.1 200")

async def opened(gate):
    async with gate:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            return (reader, writer) if await ask(reader, writer) else None
        except (OSError, asyncio.IncompleteReadError, ValueError):
            return None

async def still_answers(conn):
    try:
        return await asyncio.wait_for(ask(*conn), 30)
    except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError):
        return False

async def main():
    gate = asyncio.Semaphore(256)
    conns = await asyncio.gather(*(opened(gate) for _ in range(count)))
    live = [c for c in conns if c]
    print(f"READY open={len(live)} failed={count - len(live)}", flush=True)
    await asyncio.sleep(hold)
    answers = await asyncio.gather(*(still_answers(c) for c in live))
    print(f"DONE answered={sum(answers)} dropped={len(live) - sum(answers)}", flush=True)
    for _, writer in live:
        writer.close()

asyncio.run(main())
PY

log "before: ${phase_seconds}s of $rate chat requests/s per target"
sleep 2
rss_idle=$(rss_mb)
before=$(load "$phase_seconds")
rss_before=$(rss_mb)

log "opening $idle idle keep-alive connections"
mark=$(($(wc -l <"$tmp/rss") + 1))
python3 "$tmp/hold.py" "$proxy_port" "$idle" "$((seconds + 5))" >"$tmp/hold.out" &
holder=$!
pids+=("$holder")
until grep -qs READY "$tmp/hold.out"; do
  kill -0 "$holder" 2>/dev/null || { cat "$tmp/hold.out" >&2; exit 1; }
  sleep 0.5
done
rss_opened=$(rss_mb)
log "during: $(head -1 "$tmp/hold.out"); ${seconds}s of load, half direct, half through the proxy"
during=$(load "$((seconds / 2))")
wait "$holder" || true
rss_during_peak=$(peak_since "$mark")

sleep 5
rss_after_close=$(rss_mb)
log "after: ${phase_seconds}s of load per target"
after=$(load "$phase_seconds")
rss_after=$(rss_mb)

cat <<REPORT

Soak: $idle idle keep-alive connections, ${seconds}s of $rate chat requests/s over $connections connections ($(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg))

| phase | proxy RSS | added latency, errors |
| --- | --- | --- |
| idle, before any load | $rss_idle MB | |
| before: load alone | $rss_before MB | $(added <<<"$before") |
| during: idle connections opened | $rss_opened MB | $(head -1 "$tmp/hold.out" | cut -d' ' -f2-) |
| during: load beside them (peak) | $rss_during_peak MB | $(added <<<"$during") |
| idle connections, after the load | | $(grep DONE "$tmp/hold.out" | cut -d' ' -f2-) |
| after: connections closed | $rss_after_close MB | |
| after: load alone | $rss_after MB | $(added <<<"$after") |
REPORT
