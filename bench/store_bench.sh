#!/usr/bin/env bash
# Runs store_bench against real servers: one Redis (appendonly, appendfsync always), a three-master
# Redis Cluster and PostgreSQL 15 (fsync on), each started into a temporary directory with
# tests/servers/redis.sh and postgres.sh on loopback, and stopped again on exit.
#
#   bench/store_bench.sh [--tls] [store_bench flags]     default: --scale 10000,1000000
#
# --tls: the single Redis is a TLS server (redis.sh start-tls) that also opens a plain port;
# the ledger cases run over both (store_bench --redis-tls), to show what TLS costs.
#
# STORE_BENCH (default build-bench/bench/store_bench) is the binary.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${STORE_BENCH:-build-bench/bench/store_bench}
[ -x "$bin" ] || { echo "store_bench.sh: $bin is not built" >&2; exit 1; }
tls=0
if [ "${1:-}" = --tls ]; then
  tls=1
  shift
fi
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

redis=()
if [ "$tls" = 1 ]; then
  tests/servers/redis.sh start-tls "$dir/redis"
  # Redis 7 opens a plain port beside the TLS one at run time: for the counters, redis-benchmark
  # and the plain cases, on the same server.
  tls_url=$(cat "$dir/redis/url")
  tls_port=${tls_url#rediss://127.0.0.1:}
  tls_port=${tls_port%%\?*}
  plain_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  redis-cli --tls --cacert "$dir/redis/tls/ca.crt" --cert "$dir/redis/tls/client.crt" \
    --key "$dir/redis/tls/client.key" -p "$tls_port" config set port "$plain_port" >/dev/null
  redis=(--redis "redis://127.0.0.1:$plain_port" --redis-tls "$tls_url")
else
  tests/servers/redis.sh start "$dir/redis"
  redis=(--redis "$(cat "$dir/redis/url")")
fi
tests/servers/redis.sh start-cluster "$dir/cluster"
tests/servers/postgres.sh start "$dir/pg"

echo "redis-server: $(redis-server --version | awk '{print $3}'); $(psql --version)"
"$bin" "${redis[@]}" --cluster "$(cat "$dir/cluster/url")" \
  --postgres "$(cat "$dir/pg/url")" "${args[@]}"
