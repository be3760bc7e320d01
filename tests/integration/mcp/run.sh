#!/usr/bin/env bash
# Runs the `idemgate mcp` integration tests: the official TypeScript SDK client against the
# example server and the reference servers, directly and through the idemgate binary.
#
#   IDEMGATE=/path/to/idemgate tests/integration/mcp/run.sh [node --test args…] [FILE.mjs…]
#
# IDEMGATE defaults to build/idemgate. Installs the npm packages from the committed lock files
# here and in examples/mcp-server when they are missing or older (tests/integration/npm_install.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
export IDEMGATE=${IDEMGATE:-$root/build/idemgate}

bash "$root/tests/integration/npm_install.sh" "$here" "$root/examples/mcp-server"

if [ ! -x "$IDEMGATE" ]; then
  echo "run.sh: no idemgate binary at $IDEMGATE (build it, or set IDEMGATE)" >&2
  exit 1
fi

cd "$here"
# One test file at a time: each starts several processes, and timing-sensitive ones (the
# crash test's short lease) should not compete for two cores.
# Test files named on the command line run alone (fault_points.mjs, a CTest entry of its own);
# otherwise every *.test.mjs, after any node --test flags given.
if [ "$#" -gt 0 ] && [[ "${!#}" == *.mjs ]]; then
  exec node --test --test-concurrency=1 "$@"
fi
exec node --test --test-concurrency=1 "$@" ./*.test.mjs
