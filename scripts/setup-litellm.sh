#!/usr/bin/env bash
# Installs LiteLLM's proxy (`litellm[proxy]`, pinned) for tests/suite/litellm.rs, in a venv of
# its own outside the checkout, in $COMPACTION_PROXY_CACHE (default
# ~/.cache/compaction-proxy): it pulls ~120 packages, ~740 MB, ~1.5 min to install, too
# much to add to ./.venv. Later runs skip it. (The `proxy` extra of the releases after
# this one needs `litellm-proxy` or `litellm-proxy-extras` versions the index lacks.)
# Prints the path the test needs: `litellm=...`.
set -euo pipefail
LITELLM_VERSION=1.106.12
ROOT=${COMPACTION_PROXY_CACHE:-$HOME/.cache/compaction-proxy}/litellm-$LITELLM_VERSION
if ! "$ROOT/bin/python" -c "
import sys, importlib.metadata as m
sys.exit(m.version('litellm') != '$LITELLM_VERSION')
" 2>/dev/null || [ ! -x "$ROOT/bin/litellm" ]; then
  python3 -m venv "$ROOT"
  "$ROOT/bin/pip" install --quiet --disable-pip-version-check "litellm[proxy]==$LITELLM_VERSION"
fi
echo "litellm=$ROOT/bin/litellm"
