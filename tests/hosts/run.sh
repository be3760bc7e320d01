#!/usr/bin/env bash
# Runs the host lab: the real Claude Code, Codex and Gemini CLI (pinned in package.json) and an
# agent SDK's MCP client, each driven by a scripted model endpoint on loopback (models/*.mjs),
# through the real idemgate binary in front of the example MCP server.
#
#   IDEMGATE=/path/to/idemgate tests/hosts/run.sh [node --test args…] [FILE.test.mjs…]
#
# IDEMGATE defaults to build/idemgate. Installs the npm packages from the committed lock files
# here, in examples/mcp-server and in tests/integration/mcp (whose helpers.mjs lib.mjs shares)
# when they are missing or older (tests/integration/npm_install.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
export IDEMGATE=${IDEMGATE:-$root/build/idemgate}

bash "$root/tests/integration/npm_install.sh" "$here" "$root/examples/mcp-server" \
  "$root/tests/integration/mcp"

if [ ! -x "$IDEMGATE" ]; then
  echo "run.sh: no idemgate binary at $IDEMGATE (build it, or set IDEMGATE)" >&2
  exit 1
fi

cd "$here"
# One host process at a time: each run starts a host, idemgate and the example server, and the
# lab shares two cores with the rest of the suite.
if [ "$#" -gt 0 ] && [[ "${!#}" == *.mjs ]]; then
  exec node --test --test-concurrency=1 "$@"
fi
exec node --test --test-concurrency=1 "$@" ./*.test.mjs
