#!/usr/bin/env bash
# A throw-away PostgreSQL 15 server for tests, listening on 127.0.0.1 only.
#
#   postgres.sh start DIR   creates a cluster in DIR/data (unless there is one), starts it on a
#                           free port (the same port again on a restart), creates the database
#                           `idemgate`, waits until it accepts connections, and writes
#                           postgres://postgres@127.0.0.1:PORT/idemgate to DIR/url
#   postgres.sh crash DIR   stops it like a power cut (pg_ctl stop -m immediate), keeps DIR
#   postgres.sh stop DIR    stops it (pg_ctl stop -m fast) and removes DIR
#
# Configuration is PostgreSQL's default (fsync on, synchronous_commit on) except where it
# listens: TCP on 127.0.0.1 and a Unix socket inside DIR, trust authentication for those
# only. Run as root, the server runs as the `postgres` OS user (initdb refuses root), so DIR
# and its parents must be traversable by that user: use a directory under /tmp.
set -euo pipefail

usage() {
  echo "usage: $0 start|crash|stop DIR" >&2
  exit 2
}
[ $# -eq 2 ] || usage
cmd=$1
dir=$2
case "$dir" in /*) ;; *) dir=$PWD/$dir ;; esac

bindir=/usr/lib/postgresql/15/bin
if [ ! -x "$bindir/initdb" ]; then
  bindir=$(pg_config --bindir 2>/dev/null || true)
fi
if [ ! -x "$bindir/initdb" ]; then
  echo "postgres.sh: PostgreSQL 15 server binaries not found; install postgresql-15 (scripts/setup)" >&2
  exit 1
fi

# Runs a server binary as the postgres user when we are root.
as_server_user() {
  if [ "$(id -u)" -eq 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

running() {
  [ -f "$dir/data/postmaster.pid" ] && as_server_user "$bindir/pg_ctl" -D "$dir/data" status >/dev/null 2>&1
}

init_cluster() {
  as_server_user "$bindir/initdb" -D "$dir/data" -U postgres -E UTF8 --locale=C \
    --auth=trust --no-instructions >"$dir/initdb.log" 2>&1 || {
    cat "$dir/initdb.log" >&2
    return 1
  }
  cat >"$dir/data/pg_hba.conf" <<'EOF'
# Trust, but only on the socket inside the test directory and on loopback.
local all all              trust
host  all all 127.0.0.1/32 trust
EOF
  cat >>"$dir/data/postgresql.conf" <<EOF

# tests/servers/postgres.sh
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
EOF
}

start() {
  mkdir -p "$dir"
  if [ "$(id -u)" -eq 0 ]; then
    chown postgres:postgres "$dir"
  fi
  chmod 0755 "$dir"
  cd "$dir"  # the server user may not be able to read the caller's working directory

  [ -f "$dir/data/PG_VERSION" ] || init_cluster

  if ! running; then
    local attempt port
    for attempt in 1 2 3; do
      # A restart keeps its port: clients hold the URL.
      if [ -f "$dir/port" ]; then port=$(cat "$dir/port"); else port=$(free_port); fi
      if as_server_user "$bindir/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t 60 \
        -o "-p $port" start >/dev/null; then
        echo "$port" >"$dir/port"
        break
      fi
      # Another process may have taken the free port between our probe and the bind.
      if [ -f "$dir/port" ] || [ "$attempt" -eq 3 ]; then
        echo "postgres.sh: the server in $dir did not start; its log:" >&2
        tail -n 20 "$dir/postgres.log" >&2 || true
        exit 1
      fi
    done
  fi

  local port
  port=$(cat "$dir/port")
  for _ in $(seq 1 300); do
    "$bindir/pg_isready" -q -h 127.0.0.1 -p "$port" -U postgres && break
    sleep 0.1
  done
  "$bindir/pg_isready" -q -h 127.0.0.1 -p "$port" -U postgres || {
    echo "postgres.sh: the server on 127.0.0.1:$port does not accept connections" >&2
    exit 1
  }
  if [ -z "$("$bindir/psql" -h 127.0.0.1 -p "$port" -U postgres -d postgres -tAX \
    -c "SELECT 1 FROM pg_database WHERE datname = 'idemgate'")" ]; then
    "$bindir/createdb" -h 127.0.0.1 -p "$port" -U postgres idemgate
  fi
  echo "postgres://postgres@127.0.0.1:$port/idemgate" >"$dir/url"
  echo "postgres.sh: PostgreSQL listening on 127.0.0.1:$port (data in $dir/data)" >&2
}

case "$cmd" in
  start) start ;;
  crash)
    cd /
    if running; then as_server_user "$bindir/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null; fi
    ;;
  stop)
    cd /
    if running; then as_server_user "$bindir/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null; fi
    rm -rf "$dir"
    ;;
  *) usage ;;
esac
