#!/usr/bin/env bash
# Installs verifiers 0.4.0 (the `verifiers` extra, `--env verifiers:ID`) into an overlay
# directory instead of the venv: verifiers pins openai<3 and mcp==2.0.0, while the `agents`
# extra (openai-agents 0.24.0) and the dev pins need openai>=3. verifiers' v1 API works with
# the venv's openai 3.x and mcp 2.x, so only the packages the venv lacks go in, without
# their dependencies. Use it with PYTHONPATH=OVERLAY (the tests do).
#
#   scripts/install-overlay-verifiers.sh [VENV [OVERLAY]]   # defaults: .venv, VENV/overlays/verifiers
set -euo pipefail
VENV=${1:-.venv}
OVERLAY=${2:-$VENV/overlays/verifiers}
STAMP=$OVERLAY/.installed-verifiers-0.4.0
[ -f "$STAMP" ] && exit 0
rm -rf "$OVERLAY"
"$VENV/bin/pip" install -q --no-deps --target "$OVERLAY" \
  verifiers==0.4.0 \
  aiofiles==25.1.0 \
  antlr4-python3-runtime==4.13.2 \
  connectrpc==0.11.1 \
  gepa==0.1.4 \
  latex2sympy2_extended==1.11.0 \
  math-verify==0.9.0 \
  prime-pydantic-config==0.4.3 \
  prime-runs==0.1.4 \
  prime-sandboxes==0.5.1 \
  prime-traces==0.0.10 \
  prime-tunnel==0.1.15 \
  protobuf-py==0.1.1 \
  protobuf-py-ext==0.1.1 \
  pyqwest==0.12.0 \
  renderers==0.1.12 \
  tomli-w==1.2.0
# --target puts console scripts in OVERLAY/bin; agentrl needs none of them.
rm -rf "$OVERLAY/bin"
PYTHONPATH=$OVERLAY "$VENV/bin/python" -c "import verifiers.v1"
touch "$STAMP"
