#!/usr/bin/env bash
# Runs the HTTP benchmark of `idemgate http` (bench/http/bench.mjs; bench/README.md says what it
# measures): installs its npm packages (npm ci, from bench/http/package-lock.json) when they are
# missing or older than the lock file, checks for wrk, redis-server and node, then runs the bench,
# which starts Redis on a free port in a temporary directory (tests/servers/redis.sh), the example
# vendor, the two Node peers and idemgate http, and stops them all by pid.
#
#   bench/http/bench.sh [bench.mjs flags]      e.g. --seconds 10 --rounds 3 --connections 32
#
# IDEMGATE (or --idemgate) is the binary; default build-bench/idemgate, else build-h5/idemgate.
# Without a binary that has `idemgate http`, the idemgate cases are skipped and the vendor and
# the peers are measured alone.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
for tool in node npm wrk redis-server redis-cli; do
  command -v "$tool" >/dev/null || { echo "bench/http: $tool is missing (scripts/setup installs wrk and redis)" >&2; exit 1; }
done
if [ ! -f "$here/node_modules/.package-lock.json" ] ||
   [ "$here/package-lock.json" -nt "$here/node_modules/.package-lock.json" ]; then
  (cd "$here" && npm ci --no-audit --no-fund --loglevel=error)
fi
exec node "$here/bench.mjs" "$@"
