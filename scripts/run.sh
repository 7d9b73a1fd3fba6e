#!/usr/bin/env bash
# Runs Plaza in embedded mode (one process, no other service) with the demo app at
# http://127.0.0.1:7700/. Builds the demo (web/demo, needs Node.js >= 20 and npm) first.
# Arguments are passed to `plaza serve`, e.g. `scripts/run.sh --listen 0.0.0.0:7700`.
# Rooms are kept in data/ (ignored by git): they are there again after a restart; remove the
# directory to start afresh.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null; then
  echo "cargo is required (https://rustup.rs)" >&2
  exit 1
fi
if ! command -v npm >/dev/null; then
  echo "npm is required to build the demo (Node.js >= 20, https://nodejs.org)" >&2
  exit 1
fi

echo "== building the demo (web/demo)"
# npm ci only when the lock file changed since the last install.
if [ ! -f web/demo/node_modules/.package-lock.json ] ||
  [ web/demo/package-lock.json -nt web/demo/node_modules/.package-lock.json ]; then
  (cd web/demo && npm ci --no-audit --no-fund)
fi
(cd web/demo && npm run build)

echo "== starting plaza (release build)"
exec cargo run --release --locked -p plaza -- serve --web-dir web/demo/dist --data-dir data "$@"
