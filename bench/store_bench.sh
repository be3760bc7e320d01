#!/usr/bin/env bash
# Runs store_bench against real servers: one Redis (appendonly, appendfsync always), a three-master
# Redis Cluster and PostgreSQL 15 (fsync on), each started into a temporary directory with
# tests/servers/redis.sh and postgres.sh on loopback, and stopped again on exit.
#
#   bench/store_bench.sh [store_bench flags]     default: --scale 10000,1000000
#
# STORE_BENCH (default build-bench/bench/store_bench) is the binary.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${STORE_BENCH:-build-bench/bench/store_bench}
[ -x "$bin" ] || { echo "store_bench.sh: $bin is not built" >&2; exit 1; }
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--scale 10000,1000000)

# Under /tmp: postgres.sh runs the server as the postgres user, who must reach the directory.
dir=$(mktemp -d /tmp/store_bench.XXXXXX)
chmod 0755 "$dir"
cleanup() {
  tests/servers/redis.sh stop "$dir/redis" || true
  tests/servers/redis.sh stop "$dir/cluster" || true
  tests/servers/postgres.sh stop "$dir/pg" || true
  rm -rf "$dir"
}
trap cleanup EXIT INT TERM

tests/servers/redis.sh start "$dir/redis"
tests/servers/redis.sh start-cluster "$dir/cluster"
tests/servers/postgres.sh start "$dir/pg"

echo "redis-server: $(redis-server --version | awk '{print $3}'); $(psql --version)"
"$bin" --redis "$(cat "$dir/redis/url")" --cluster "$(cat "$dir/cluster/url")" \
  --postgres "$(cat "$dir/pg/url")" "${args[@]}"
