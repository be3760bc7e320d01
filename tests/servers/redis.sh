#!/usr/bin/env bash
# Real Redis servers for the tests, on loopback only.
#
#   redis.sh start DIR [PORT|auto [ARGS…]]
#                              one server (appendonly, appendfsync always) in DIR, on PORT
#                              or a free port; reuses DIR's data if any (a restart);
#                              ARGS go to redis-server (e.g. --replicaof 127.0.0.1 6379);
#                              writes DIR/url
#   redis.sh start-cluster DIR three cluster masters in DIR/node{1,2,3}; writes DIR/url
#   redis.sh stop DIR          stops the servers started in DIR (by their pidfiles) and
#                              removes DIR
#
# A server that does not answer PING (or a cluster that does not reach
# cluster_state:ok) within 10 s fails the command, printing the server's log.
set -euo pipefail

usage() {
  echo "usage: redis.sh start DIR [PORT|auto [ARGS…]] | start-cluster DIR | stop DIR" >&2
  exit 2
}

# Prints N distinct free loopback ports (all bound at once, then released).
free_ports() {
  python3 - "${1:-1}" <<'PY'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

# Is the pid in $1 a live redis-server? (The pidfile may be stale and the pid reused.)
is_redis() {
  [ -n "$1" ] && [ -r "/proc/$1/comm" ] && grep -q '^redis-server' "/proc/$1/comm"
}

stop_one() {  # DIR
  local pidfile="$1/redis.pid" pid
  [ -f "$pidfile" ] || return 0
  pid=$(cat "$pidfile")
  if is_redis "$pid"; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do
      is_redis "$pid" || break
      sleep 0.05
    done
    if is_redis "$pid"; then kill -KILL "$pid" 2>/dev/null || true; fi
  fi
  rm -f "$pidfile"
}

wait_ping() {  # PORT DIR
  for _ in $(seq 1 200); do
    if [ "$(redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null || true)" = "PONG" ]; then return 0; fi
    sleep 0.05
  done
  echo "redis.sh: redis-server on 127.0.0.1:$1 did not answer PING; its log:" >&2
  cat "$2/redis.log" >&2 || true
  return 1
}

start_one() {  # DIR PORT [extra redis-server args]
  local dir=$1 port=$2
  shift 2
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  stop_one "$dir"  # a server left over from an interrupted run
  if ! redis-server --bind 127.0.0.1 --port "$port" --protected-mode yes \
    --dir "$dir" --appendonly yes --appendfsync always --save "" \
    --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" "$@"; then
    echo "redis.sh: redis-server failed to start on 127.0.0.1:$port; its log:" >&2
    cat "$dir/redis.log" >&2 2>/dev/null || true
    return 1
  fi
  wait_ping "$port" "$dir"
  for _ in $(seq 1 100); do
    [ -s "$dir/redis.pid" ] && return 0
    sleep 0.05
  done
  echo "redis.sh: no pidfile in $dir" >&2
  return 1
}

cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || usage

case "$cmd" in
  start)
    port=${3:-auto}
    extra=("${@:4}")
    if [ "$port" = auto ]; then
      # A free port can be taken between the probe and the bind: try a few.
      for _ in 1 2 3; do
        port=$(free_ports 1)
        if start_one "$dir" "$port" "${extra[@]}"; then break; fi
        port=""
      done
      [ -n "$port" ] || exit 1
    else
      start_one "$dir" "$port" "${extra[@]}"
    fi
    echo "redis://127.0.0.1:$port" >"$dir/url"
    echo "redis.sh: redis://127.0.0.1:$port (pid $(cat "$dir/redis.pid"), dir $dir)" >&2
    ;;
  start-cluster)
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    nodes=()
    read -r -a ports <<<"$(free_ports 6)"  # a client port and a cluster bus port each
    for i in 1 2 3; do
      port=${ports[$(((i - 1) * 2))]}
      bus=${ports[$(((i - 1) * 2 + 1))]}
      rm -f "$dir/node$i/nodes.conf"  # a fresh cluster every time
      start_one "$dir/node$i" "$port" --cluster-enabled yes --cluster-port "$bus" \
        --cluster-config-file "$dir/node$i/nodes.conf" --cluster-node-timeout 5000
      nodes+=("127.0.0.1:$port")
    done
    redis-cli --cluster create "${nodes[@]}" --cluster-replicas 0 --cluster-yes >"$dir/create.log" 2>&1 || {
      echo "redis.sh: redis-cli --cluster create failed:" >&2
      cat "$dir/create.log" >&2
      exit 1
    }
    for node in "${nodes[@]}"; do
      ok=""
      for _ in $(seq 1 200); do
        if redis-cli -h 127.0.0.1 -p "${node#*:}" cluster info 2>/dev/null | grep -q '^cluster_state:ok'; then
          ok=1
          break
        fi
        sleep 0.05
      done
      if [ -z "$ok" ]; then
        echo "redis.sh: $node did not reach cluster_state:ok" >&2
        exit 1
      fi
    done
    (IFS=,; echo "redis+cluster://${nodes[*]}") >"$dir/url"
    echo "redis.sh: $(cat "$dir/url") (dir $dir)" >&2
    ;;
  stop)
    [ -d "$dir" ] || exit 0
    stop_one "$dir"
    for node in "$dir"/node*; do
      [ -d "$node" ] && stop_one "$node"
    done
    rm -rf "$dir"
    ;;
  *)
    usage
    ;;
esac
