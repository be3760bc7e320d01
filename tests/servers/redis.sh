#!/usr/bin/env bash
# Real Redis servers for the tests, on loopback only.
#
#   redis.sh start DIR [PORT|auto [ARGS…]]
#                              one server (appendonly, appendfsync always) in DIR, on PORT
#                              or a free port; reuses DIR's data if any (a restart);
#                              ARGS go to redis-server (e.g. --replicaof 127.0.0.1 6379);
#                              writes DIR/url
#   redis.sh start-cluster DIR three cluster masters in DIR/node{1,2,3}; writes DIR/url
#   redis.sh start-tls DIR     one TLS-only server (clients must show a certificate) in DIR,
#                              on a free port; the certificates in DIR/tls: ca.crt signed
#                              server.crt (localhost, 127.0.0.1) and client.crt, and
#                              other-ca.crt signed nothing (for negative tests); writes
#                              DIR/url: rediss://127.0.0.1:P?tls_ca=…&tls_cert=…&tls_key=…
#   redis.sh start-tls-cluster DIR
#                              three TLS-only cluster masters (TLS on the cluster bus too),
#                              certificates as start-tls; writes DIR/url: rediss+cluster://…
#   redis.sh stop DIR          stops the servers started in DIR (by their pidfiles) and
#                              removes DIR
#
# A server that does not answer PING (or a cluster that does not reach
# cluster_state:ok) within 10 s fails the command, printing the server's log.
set -euo pipefail

usage() {
  echo "usage: redis.sh start DIR [PORT|auto [ARGS…]] | start-cluster DIR | start-tls DIR |" \
    "start-tls-cluster DIR | stop DIR" >&2
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

# Is the pid in $1 a live redis-server? (The pidfile may be stale and the pid reused.) A zombie
# is not: it has exited and let go of its port and files, and only waits for its parent to reap
# it. A daemon's parent is init, which here took about 1.4 s to get to it.
is_redis() {
  local stat
  [ -n "$1" ] && grep -q '^redis-server' "/proc/$1/comm" 2>/dev/null || return 1
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }  # the fields after "(comm) ": state first
  [ "${stat%% *}" != Z ]
}

# Stops the servers of the DIRs given (by their pidfiles): SIGTERM to all,
# then one wait for all of them (a cluster's three are not waited for one
# after the other). Up to 5 s, then SIGKILL.
stop_dirs() {  # DIR...
  local d pid pids=()
  for d in "$@"; do
    [ -f "$d/redis.pid" ] || continue
    pid=$(cat "$d/redis.pid")
    if is_redis "$pid"; then
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$pid")
    fi
  done
  for _ in $(seq 1 100); do
    local left=()
    for pid in "${pids[@]}"; do is_redis "$pid" && left+=("$pid"); done
    pids=("${left[@]}")
    [ ${#pids[@]} -eq 0 ] && break
    sleep 0.05
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  for d in "$@"; do rm -f "$d/redis.pid"; done
}

# TLS, once use_tls has run: redis-server's and redis-cli's arguments, and the URL's scheme
# and query. Empty: plain TCP.
server_tls=()
cli=()
scheme=redis
query=""

# Runs openssl quietly; on failure prints what it said.
openssl_quiet() {
  local out
  out=$(openssl "$@" 2>&1) || {
    echo "redis.sh: openssl $1 failed: $out" >&2
    return 1
  }
}

# A new EC key DIR/NAME.key and its certificate DIR/NAME.crt, signed by DIR/ca.crt.
sign() {  # DIR NAME SUBJECT EXTENSIONS (x509v3 config lines)
  openssl_quiet req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$1/$2.key" -out "$1/$2.csr" -subj "$3"
  openssl_quiet x509 -req -in "$1/$2.csr" -CA "$1/ca.crt" -CAkey "$1/ca.key" -CAcreateserial \
    -days 3650 -out "$1/$2.crt" -extfile <(echo "$4")
  rm -f "$1/$2.csr"
}

# Makes start-tls's certificates in DIR/tls (fresh every time) and switches the servers,
# redis-cli and the URL to TLS.
use_tls() {  # DIR
  local tls=$1/tls
  rm -rf "$tls"
  mkdir -p "$tls"
  for ca in ca other-ca; do
    openssl_quiet req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
      -keyout "$tls/$ca.key" -out "$tls/$ca.crt" -subj "/CN=idemgate test $ca"
  done
  rm -f "$tls/other-ca.key"  # it signs nothing
  # clientAuth too: a server shows this certificate when it connects to another (cluster bus).
  sign "$tls" server /CN=localhost \
    $'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth'
  sign "$tls" client "/CN=idemgate test client" "extendedKeyUsage=clientAuth"
  server_tls=(--tls-cert-file "$tls/server.crt" --tls-key-file "$tls/server.key"
    --tls-ca-cert-file "$tls/ca.crt")
  cli=(--tls --cacert "$tls/ca.crt" --cert "$tls/client.crt" --key "$tls/client.key")
  scheme=rediss
  # The URL %-decodes option values: encode the paths.
  query=$(python3 -c '
import sys, urllib.parse
tls = sys.argv[1]
files = [("tls_ca", "ca.crt"), ("tls_cert", "client.crt"), ("tls_key", "client.key")]
print("?" + "&".join(k + "=" + urllib.parse.quote(tls + "/" + f, safe="/") for k, f in files))
' "$tls")
}

wait_ping() {  # PORT DIR
  for _ in $(seq 1 200); do
    if [ "$(redis-cli "${cli[@]}" -h 127.0.0.1 -p "$1" ping 2>/dev/null || true)" = "PONG" ]; then
      return 0
    fi
    sleep 0.05
  done
  echo "redis.sh: redis-server on 127.0.0.1:$1 did not answer PING; its log:" >&2
  cat "$2/redis.log" >&2 || true
  return 1
}

start_one() {  # DIR PORT [extra redis-server args]
  local dir=$1 port=$2 listen
  shift 2
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  stop_dirs "$dir"  # a server left over from an interrupted run
  listen=(--port "$port")
  if [ ${#server_tls[@]} -gt 0 ]; then listen=(--port 0 --tls-port "$port" "${server_tls[@]}"); fi
  if ! redis-server --bind 127.0.0.1 "${listen[@]}" --protected-mode yes \
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

start_single() {  # DIR [PORT|auto [ARGS…]]: writes DIR/url
  local dir=$1 port=${2:-auto}
  local extra=("${@:3}")
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
  echo "$scheme://127.0.0.1:$port$query" >"$dir/url"
  echo "redis.sh: $(cat "$dir/url") (pid $(cat "$dir/redis.pid"), dir $dir)" >&2
}

start_cluster() {  # DIR: three masters in DIR/node{1,2,3}; writes DIR/url
  local dir=$1 nodes=() ports port bus announced tls_bus=()
  if [ ${#server_tls[@]} -gt 0 ]; then tls_bus=(--tls-cluster yes --tls-replication yes); fi
  read -r -a ports <<<"$(free_ports 6)"  # a client port and a cluster bus port each
  for i in 1 2 3; do
    port=${ports[$(((i - 1) * 2))]}
    bus=${ports[$(((i - 1) * 2 + 1))]}
    rm -f "$dir/node$i/nodes.conf"  # a fresh cluster every time
    start_one "$dir/node$i" "$port" --cluster-enabled yes --cluster-port "$bus" \
      --cluster-config-file "$dir/node$i/nodes.conf" --cluster-node-timeout 5000 "${tls_bus[@]}"
    nodes+=("127.0.0.1:$port")
  done
  redis-cli "${cli[@]}" --cluster create "${nodes[@]}" --cluster-replicas 0 --cluster-yes \
    >"$dir/create.log" 2>&1 || {
    echo "redis.sh: redis-cli --cluster create failed:" >&2
    cat "$dir/create.log" >&2
    exit 1
  }
  for node in "${nodes[@]}"; do
    ok=""
    for _ in $(seq 1 200); do
      if redis-cli "${cli[@]}" -h 127.0.0.1 -p "${node#*:}" cluster info 2>/dev/null |
        grep -q '^cluster_state:ok'; then
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
  # Clients go where CLUSTER SLOTS points them: it must be the ports above (with TLS, the
  # TLS ports, not the disabled plain ones).
  announced=$(redis-cli "${cli[@]}" -c -h 127.0.0.1 -p "${ports[0]}" cluster slots |
    awk 'prev == "127.0.0.1" { print "127.0.0.1:" $0 } { prev = $0 }' | sort -u)
  if [ "$announced" != "$(printf '%s\n' "${nodes[@]}" | sort -u)" ]; then
    echo "redis.sh: the cluster announces" "${announced//$'\n'/ }" "instead of ${nodes[*]}" >&2
    exit 1
  fi
  (IFS=,; echo "$scheme+cluster://${nodes[*]}$query") >"$dir/url"
  echo "redis.sh: $(cat "$dir/url") (dir $dir)" >&2
}

cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || usage

case "$cmd" in
  start)
    start_single "${@:2}"
    ;;
  start-cluster | start-tls | start-tls-cluster)
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    if [ "$cmd" != start-cluster ]; then use_tls "$dir"; fi
    if [ "$cmd" = start-tls ]; then start_single "$dir"; else start_cluster "$dir"; fi
    ;;
  stop)
    [ -d "$dir" ] || exit 0
    nodes=()
    for node in "$dir"/node*; do
      [ -d "$node" ] && nodes+=("$node")
    done
    stop_dirs "$dir" "${nodes[@]}"
    rm -rf "$dir"
    ;;
  *)
    usage
    ;;
esac
