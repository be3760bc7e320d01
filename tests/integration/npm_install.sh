#!/usr/bin/env bash
# Installs the npm packages of each folder given, from its committed lock file (npm ci; npm
# install if the lock is out of date), unless they are installed already and no older than
# the lock. Idempotent, and a no-op when up to date: `npm ci` deletes node_modules first, so
# installing again while another test runs a server from that folder would pull its packages
# away mid-test. CTest runs this once, as the npm_packages fixture, before every test that
# needs the packages (tests/CMakeLists.txt); the run.sh scripts call it too, for running them
# by hand.
#
#   tests/integration/npm_install.sh DIR [DIR…]
set -euo pipefail
flags=(--no-audit --no-fund --loglevel=error)
for dir in "$@"; do
  stamp=$dir/node_modules/.package-lock.json
  if [ -f "$stamp" ] && [ ! "$dir/package-lock.json" -nt "$stamp" ]; then
    continue
  fi
  (cd "$dir" && { npm ci "${flags[@]}" || npm install "${flags[@]}"; })
done
