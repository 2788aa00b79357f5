# Shell helpers shared by the bench scripts (sourced, not run).

# A loopback port nobody listens on (bounded tries; the race with other users of the
# machine is accepted, the start-up checks catch it).
free_port() {
  local port tries
  for ((tries = 0; tries < 100; tries++)); do
    port=$((20000 + RANDOM % 30000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "$port"
      return
    fi
  done
  echo "${0##*/}: no free port found" >&2
  return 1
}

# Waits (bounded) for "listening on http://127.0.0.1:PORT" in a log; prints PORT.
wait_listening() { # file
  local file=$1 tries port
  for ((tries = 0; tries < 100; tries++)); do
    port=$(sed -n 's|.*listening on http://127\.0\.0\.1:\([0-9]*\).*|\1|p' "$file" 2>/dev/null | head -1)
    if [[ -n $port ]]; then
      echo "$port"
      return
    fi
    sleep 0.1
  done
  echo "${0##*/}: nothing listening after 10 s; log:" >&2
  cat "$file" >&2
  return 1
}

# Waits (bounded) until PORT accepts connections; gives up early if PID exits.
wait_port() { # port [seconds] [pid]
  local port=$1 seconds=${2:-10} pid=${3:-} tries
  for ((tries = 0; tries < seconds * 10; tries++)); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return; fi
    if [[ -n $pid ]] && ! kill -0 "$pid" 2>/dev/null; then return 1; fi
    sleep 0.1
  done
  echo "${0##*/}: port $port not open after $seconds s" >&2
  return 1
}
