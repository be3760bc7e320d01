#!/usr/bin/env bash
# Runs the operator console's browser test: Debian's chromium (scripts/setup installs it)
# driven by playwright-core against the real idemgate binary.
#
#   IDEMGATE=/path/to/idemgate [CHROMIUM=/usr/bin/chromium] [CONSOLE_SCREENSHOTS=DIR] \
#     tests/integration/console/run.sh
#
# IDEMGATE defaults to build/idemgate. Screenshots of each view are written to
# CONSOLE_SCREENSHOTS when set; CONSOLE_SCREENSHOTS=docs/console refreshes the README's.
# Installs playwright-core from the committed lock file when it is missing or older
# (tests/integration/npm_install.sh). playwright-core downloads no browser: it drives the one at CHROMIUM.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
export IDEMGATE=${IDEMGATE:-$root/build/idemgate}
export CHROMIUM=${CHROMIUM:-/usr/bin/chromium}
if [ -n "${CONSOLE_SCREENSHOTS:-}" ]; then
  mkdir -p "$CONSOLE_SCREENSHOTS"
  CONSOLE_SCREENSHOTS=$(cd "$CONSOLE_SCREENSHOTS" && pwd)
  export CONSOLE_SCREENSHOTS
fi

bash "$root/tests/integration/npm_install.sh" "$here"

for need in "$IDEMGATE" "$CHROMIUM"; do
  if [ ! -x "$need" ]; then
    echo "run.sh: $need is missing (build idemgate; run scripts/setup for chromium)" >&2
    exit 1
  fi
done

cd "$here"
exec node --test --test-concurrency=1 ./console.test.mjs
