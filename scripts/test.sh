#!/usr/bin/env bash
# The project's test command: real clients installed, then every test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-clients.sh
COMPACTION_PROXY_REQUIRE_CLIENTS=1 cargo test "$@"
