#!/usr/bin/env bash
# Runs every Plaza test. Installs what the tests need when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n== %s\n' "$*"; }

if ! command -v cargo >/dev/null; then
  echo "cargo is required (https://rustup.rs)" >&2
  exit 1
fi
if command -v rustup >/dev/null; then
  rustup component add rustfmt clippy >/dev/null 2>&1 || true
fi

log "format"
cargo fmt --all -- --check

log "lint"
cargo clippy --workspace --all-targets --locked -- -D warnings

log "tests (unit, property, integration, doc)"
# Clippy --all-targets above already type-checks the benchmarks.
out=$(mktemp)
trap 'rm -f "$out"' EXIT
set +e
cargo test --workspace --locked 2>&1 | tee "$out"
status=${PIPESTATUS[0]}
set -e
passed=$(grep -E '^test result:' "$out" | awk '{s += $4} END {print s + 0}')
failed=$(grep -E '^test result:' "$out" | awk '{s += $6} END {print s + 0}')
echo
echo "Summary: ${passed} passed, ${failed} failed"
exit "$status"
