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

# Writes DIR/nginx.conf for nginx as the plain reverse proxy the benchmarks compare with:
# one worker, keep-alive to the upstream, no buffering, no access log.
write_nginx_conf() { # dir listen-port upstream-port
  local dir=$1 port=$2 upstream=$3
  mkdir -p "$dir"
  cat >"$dir/nginx.conf" <<CONF
worker_processes 1;
daemon off;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
events { worker_connections 8192; }
http {
  access_log off;
  client_body_temp_path $dir/body;
  proxy_temp_path $dir/proxy;
  client_max_body_size 0;
  keepalive_requests 1000000;
  upstream mock {
    server 127.0.0.1:$upstream;
    keepalive 1024;
    keepalive_requests 1000000;
  }
  server {
    listen 127.0.0.1:$port backlog=4096;
    location / {
      proxy_pass http://mock;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
    }
  }
}
CONF
}

# Ends every process in the caller's `pids` and removes its `$tmp`: the trap the scripts
# set on EXIT. A process started with setsid leads its own group, so the whole group
# (workers a peer forked) is signalled; for the others the group kill fails and the
# process alone is.
cleanup() {
  local pid
  for pid in "${pids[@]}"; do
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${pids[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$tmp"
}
