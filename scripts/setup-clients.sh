#!/usr/bin/env bash
# Installs the real clients the end-to-end tests drive, into ./.venv. Versions pinned.
set -euo pipefail
cd "$(dirname "$0")/.."
OPENAI_VERSION=3.54.0
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
if ! .venv/bin/python -c "import openai, sys; sys.exit(openai.__version__ != '$OPENAI_VERSION')" 2>/dev/null; then
  .venv/bin/pip install --quiet --disable-pip-version-check "openai==$OPENAI_VERSION"
fi
echo "clients ready: $(.venv/bin/python -c 'import openai; print("openai", openai.__version__)')"
