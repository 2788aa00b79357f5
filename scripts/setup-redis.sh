#!/usr/bin/env bash
# Installs the Redis server the replica tests (tests/suite/replicas.rs) start on loopback:
# Debian's `redis-server` package, unless a `redis-server` is already on PATH. The package
# list is refreshed only when the install fails without it, so a machine whose lists are
# current makes no extra round trip. Prints the path the tests need: `redis=...`.
set -euo pipefail
if ! command -v redis-server >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    sudo=(sudo --preserve-env=DEBIAN_FRONTEND)
  fi
  install() { "${sudo[@]}" apt-get install -y --no-install-recommends redis-server; }
  if ! install >&2; then
    "${sudo[@]}" apt-get update >&2
    install >&2
  fi
fi
echo "redis=$(command -v redis-server)"
