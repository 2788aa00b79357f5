#!/usr/bin/env bash
# The project's test command: the real clients (LiteLLM's proxy among them), the real model
# server and Redis installed, then every test. Without arguments, the suite runs first and
# the real-model session (tests/suite/real_model.rs) after it, on its own, as it needs the CPU
# for itself: the one test binary (tests/all.rs) run again with a filter that only that
# session matches. With arguments (`suite::wire::`, `-- some_name`, `--release`, ...)
# they go to one `cargo test`, with the clients and the model server required as above.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-clients.sh
llama=$(scripts/setup-llama.sh | tee /dev/stderr)
server=$(sed -n 's/^server=//p' <<<"$llama")
model=$(sed -n 's/^model=//p' <<<"$llama")
litellm=$(scripts/setup-litellm.sh | tee /dev/stderr | sed -n 's/^litellm=//p')
export COMPACTION_PROXY_LITELLM=$litellm
redis=$(scripts/setup-redis.sh | tee /dev/stderr | sed -n 's/^redis=//p')
export COMPACTION_PROXY_REDIS_SERVER=$redis COMPACTION_PROXY_REQUIRE_REDIS=1
export COMPACTION_PROXY_REQUIRE_CLIENTS=1
if [ $# -gt 0 ]; then
  COMPACTION_PROXY_LLAMA_SERVER=$server COMPACTION_PROXY_LLAMA_MODEL=$model \
    COMPACTION_PROXY_REQUIRE_LLAMA=1 cargo test "$@"
  exit
fi
# Without the server's paths the real-model test skips itself here.
env -u COMPACTION_PROXY_LLAMA_SERVER -u COMPACTION_PROXY_LLAMA_MODEL \
  -u COMPACTION_PROXY_REQUIRE_LLAMA cargo test
echo "== the real-model session (llama-server + SmolLM2, 2,048-token window)"
COMPACTION_PROXY_LLAMA_SERVER=$server COMPACTION_PROXY_LLAMA_MODEL=$model \
  COMPACTION_PROXY_REQUIRE_LLAMA=1 cargo test --test all suite::real_model:: -- --nocapture
