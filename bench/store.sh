#!/usr/bin/env bash
# The checkpoint lookup of a 1M-token conversation in every store backend: memory, the
# embedded SQLite file, and Redis on loopback (a redis-server started here, Debian's
# package installed by scripts/setup-redis.sh). Extra arguments go to criterion.
#
#   bench/store.sh                      # all three
#   bench/store.sh find/Redis           # one
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
redis=$(scripts/setup-redis.sh | sed -n 's/^redis=//p')
port=$(free_port)
dir=$(mktemp -d)
"$redis" --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" \
  >"$dir/redis.log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null; rm -rf "$dir"' EXIT
wait_port "$port" 10 "$pid"
BENCH_REDIS_URL="redis://127.0.0.1:$port" \
  cargo bench --bench checkpoint -- --warm-up-time 1 --measurement-time 3 "$@"
