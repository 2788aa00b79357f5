#!/usr/bin/env bash
# Memory and first-count cost of compaction-proxy binaries, side by side in one run
# (issue 28 item 3): resident memory (VmRSS) at start, after a session's compactions and
# after a burst of large requests has settled, and what the first request that has to be
# counted costs over the same request again (building the tokenizer on first use).
#
#   bench/memory.sh BINARY [BINARY...]      e.g. bench/memory.sh ../bin/cp-main-release \
#                                                 target/release/compaction-proxy
#
# The session is bench_engine's 128k-token agent session (code, tool output), sent as 8
# growing prefixes to a proxy that knows a 32,000-token window, so every turn past the
# first is compacted (deterministic summaries, an in-memory store). The burst is
# MEMORY_BURST (default 32) concurrent copies of the whole session (about 0.5 MB each).
# Then MEMORY_IDLE (default 2000) idle keep-alive connections, each having had one answer:
# the resident memory they add, per connection, and what stays once they close.
# Every proxy gets the mock upstream of examples/bench_upstream.rs on loopback.
# Environment: CARGO_TARGET_DIR (for the release examples), MEMORY_BURST, MEMORY_IDLE.

set -euo pipefail
(($# > 0)) || { sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
bin=$CARGO_TARGET_DIR/release
(cd "$root" && cargo build --release --quiet --example bench_upstream --example bench_engine)
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"

tmp=$(mktemp -d -t memory.XXXXXX)
# The proxies keep their state in this run's own folder: a store left in ~/.local/state by
# other runs would change what is measured, and this run must not write there either.
export XDG_STATE_HOME=$tmp/state
pids=()
# lib.sh's cleanup ends every process in `pids` and removes `$tmp`.
trap cleanup EXIT
trap 'exit 130' INT TERM

"$bin/examples/bench_engine" --out-dir "$tmp" --sizes 128000 --iterations 1 --seconds 0 >/dev/null
"$bin/examples/bench_upstream" --threads 1 >"$tmp/mock.out" 2>&1 &
pids+=($!)
mock_port=$(wait_listening "$tmp/mock.out")

cat >"$tmp/proxy.toml" <<TOML
[[models]]
match = "*"
context_window = 32000
[summarizer]
enabled = false
[cache]
backend = "memory"
TOML

cat >"$tmp/drive.py" <<'PY'
import asyncio, json, sys, threading, time, urllib.request

port, pid, session, burst = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
IDLE = int(sys.argv[5])
messages = json.load(open(session))["messages"]
url = f"http://127.0.0.1:{port}/v1/chat/completions"

def rss_mb():
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

def post(body):
    t = time.perf_counter()
    req = urllib.request.Request(url, data=body, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        r.read()
        ok = r.status == 200
    return (time.perf_counter() - t) * 1e3, ok

def body(n):
    return json.dumps({"model": "gpt-4o", "messages": messages[:n]}).encode()

time.sleep(1)
start = rss_mb()
steps = [len(messages) * k // 8 for k in range(1, 9)]
first, ok = post(body(steps[0]))
again, _ = post(body(steps[0]))
oks = [ok]
for n in steps[1:]:
    oks.append(post(body(n))[1])
time.sleep(2)
compacted = rss_mb()

whole = body(len(messages))
peak = [0.0]
done = threading.Event()
def sample():
    while not done.is_set():
        peak[0] = max(peak[0], rss_mb())
        time.sleep(0.05)
sampler = threading.Thread(target=sample)
sampler.start()
results = []
threads = [threading.Thread(target=lambda: results.append(post(whole)[1])) for _ in range(burst)]
for t in threads: t.start()
for t in threads: t.join()
done.set(); sampler.join()
time.sleep(5)
settled = rss_mb()

async def idle(count):
    """RSS per idle keep-alive connection (each having had one answer) while `count` are open."""
    async def one():
        reader, writer = await asyncio.open_connection("127.0.0.1", int(port))
        writer.write(b"GET /healthz HTTP/1.1\r\nhost: memory\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(l.split(b":")[1]) for l in head.split(b"\r\n")
                      if l.lower().startswith(b"content-length:"))
        await reader.readexactly(length)
        return writer
    before = rss_mb()
    gate = asyncio.Semaphore(128)
    async def gated():
        async with gate:
            return await one()
    writers = await asyncio.gather(*(gated() for _ in range(count)))
    await asyncio.sleep(1)
    held = rss_mb()
    for w in writers:
        w.close()
    return (held - before) * 1024 / count

idle_kb = asyncio.run(idle(IDLE))
time.sleep(3)
closed = rss_mb()
print(f"start_mb={start:.1f} after_compactions_mb={compacted:.1f} burst_peak_mb={peak[0]:.1f} "
      f"after_burst_mb={settled:.1f} first_counted_ms={first:.1f} same_again_ms={again:.1f} "
      f"idle_connection_kb={idle_kb:.1f} after_idle_closed_mb={closed:.1f} "
      f"ok={sum(oks) + sum(results)}/{len(oks) + len(results)}")
PY

for proxy in "$@"; do
  RUST_LOG=warn "$proxy" serve --config "$tmp/proxy.toml" --listen 127.0.0.1:0 \
    --upstream "http://127.0.0.1:$mock_port/v1" 2>"$tmp/proxy.log" &
  proxy_pid=$!
  pids+=("$proxy_pid")
  proxy_port=$(wait_listening "$tmp/proxy.log")
  figures=$(python3 "$tmp/drive.py" "$proxy_port" "$proxy_pid" "$tmp/session-128k.json" \
    "${MEMORY_BURST:-32}" "${MEMORY_IDLE:-2000}")
  echo "RESULT binary=$proxy size_bytes=$(stat -c %s "$proxy") $figures"
  kill "$proxy_pid"
  wait "$proxy_pid" 2>/dev/null || true
done
