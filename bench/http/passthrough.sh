#!/usr/bin/env bash
# Pass-through through `idemgate http`: requests that are not gated, relayed to the example vendor
# (examples/http-vendor/server.mjs --no-fsync) and back, against the vendor called directly, in
# one run. Each binary given gets its own `idemgate http` on a SQLite store in a temp dir (a
# pass-through never touches it), so an older and a newer build can be compared side by side.
#
#   bench/http/passthrough.sh [--seconds S] [--rounds R] [--connections C] IDEMGATE [IDEMGATE...]
#
# Cases (wrk -t2 -cC -dS per case; the cases take turns, reversed every other round):
#   small  GET /v1/charges?idempotency_key=none   a 404 of 47 bytes of JSON
#   1MiB   GET /v1/export?bytes=1048576           a 1 MiB download
# Prints requests/s per case and front, median over rounds, and each proxy's median ratio to
# the vendor direct within a round. Needs node and wrk (scripts/setup installs wrk).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
seconds=5 rounds=3 connections=32
binaries=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --connections) connections=$2; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) binaries+=("$1"); shift ;;
  esac
done
[ ${#binaries[@]} -gt 0 ] || { echo "usage: $0 [--seconds S] [--rounds R] [--connections C] IDEMGATE..." >&2; exit 2; }
for tool in node wrk; do
  command -v "$tool" >/dev/null || { echo "bench/http: $tool is missing (scripts/setup installs wrk)" >&2; exit 1; }
done

dir=$(mktemp -d /tmp/idemgate-passthrough.XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT

# Starts "$@" with its output in $dir/$name.log; sets `url` from the line with $marker. Not in a
# subshell: `pids` must see the process.
start() {
  local name=$1 marker=$2; shift 2
  "$@" >"$dir/$name.log" 2>&1 &
  pids+=($!)
  local i
  for i in $(seq 1 200); do
    if grep -q "$marker" "$dir/$name.log"; then
      url=$(grep -o "$marker[^ ]*" "$dir/$name.log" | head -1 | sed "s|$marker||")
      return
    fi
    kill -0 "${pids[-1]}" 2>/dev/null || break
    sleep 0.05
  done
  echo "bench/http: $name did not start:" >&2; cat "$dir/$name.log" >&2; exit 1
}

start vendor "listening on " node "$root/examples/http-vendor/server.mjs" --no-fsync \
  --ledger "$dir/ledger.jsonl"
vendor=$url
fronts=(vendor) urls=("$vendor")
for i in "${!binaries[@]}"; do
  start "idemgate$i" "listening on " "${binaries[$i]}" http --listen 127.0.0.1:0 \
    --upstream "$vendor" --store "sqlite:$dir/store$i.db"
  fronts+=("idemgate$i") urls+=("$url")
done
echo "vendor: $vendor"
for i in "${!binaries[@]}"; do echo "idemgate$i: ${binaries[$i]} at ${urls[$((i + 1))]}"; done

cases=(small 1MiB)
path_of() { [ "$1" = small ] && echo "/v1/charges?idempotency_key=none" || echo "/v1/export?bytes=1048576"; }

# rate[case,front,round]
declare -A rate
order=()
for c in "${cases[@]}"; do for f in "${!fronts[@]}"; do order+=("$c,$f"); done; done
for r in $(seq 1 "$rounds"); do
  run=("${order[@]}")
  if [ $((r % 2)) -eq 0 ]; then
    run=(); for ((k = ${#order[@]} - 1; k >= 0; k--)); do run+=("${order[$k]}"); done
  fi
  for cf in "${run[@]}"; do
    c=${cf%,*} f=${cf#*,}
    out=$(wrk -t2 -c"$connections" -d"${seconds}s" "${urls[$f]}$(path_of "$c")")
    rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
    non2xx=$(awk '/Non-2xx/ {print $5}' <<<"$out")
    [ "$c" = small ] || [ -z "$non2xx" ] || { echo "bench/http: $c via ${fronts[$f]}: $non2xx non-2xx answers" >&2; exit 1; }
    rate[$c,$f,$r]=$rps
    printf 'round %d  %-6s %-10s %10.0f req/s\n' "$r" "$c" "${fronts[$f]}" "$rps"
  done
done

median() { sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
echo
printf '%-6s %-10s %12s %22s\n' case front "req/s (med)" "vs vendor (med, range)"
for c in "${cases[@]}"; do
  for f in "${!fronts[@]}"; do
    med=$(for r in $(seq 1 "$rounds"); do echo "${rate[$c,$f,$r]}"; done | median)
    if [ "$f" -eq 0 ]; then
      printf '%-6s %-10s %12.0f\n' "$c" "${fronts[$f]}" "$med"
      continue
    fi
    ratios=$(for r in $(seq 1 "$rounds"); do
      awk -v a="${rate[$c,$f,$r]}" -v b="${rate[$c,0,$r]}" 'BEGIN {printf "%.3f\n", a / b}'
    done)
    printf '%-6s %-10s %12.0f %10.2f (%s–%s)\n' "$c" "${fronts[$f]}" "$med" \
      "$(median <<<"$ratios")" "$(sort -g <<<"$ratios" | head -1)" "$(sort -g <<<"$ratios" | tail -1)"
  done
done
