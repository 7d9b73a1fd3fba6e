#!/usr/bin/env bash
# Builds Plaza's fuzz targets (fuzz/) with libFuzzer on the stable toolchain, seeds each corpus
# (the protocol's own vectors for the frame decoder, fuzz/seeds/ for the others) and runs every
# target (or those named) for RUNS inputs, then prints one line per target.
#
#   scripts/fuzz.sh                      # every target, 10,000,000 inputs each
#   RUNS=200000 scripts/fuzz.sh resume   # one target, briefly
#
# A finding (a panic, a failed assertion, a 5xx, a hang over TIMEOUT_S, RSS over RSS_MB) stops
# that target with its input saved under fuzz/artifacts/<target>/; the script then fails.
# cargo fuzz would need a nightly toolchain for its sanitizer flags: the coverage
# instrumentation libFuzzer needs is a set of stable rustc flags, given here.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

RUNS=${RUNS:-10000000}
TIMEOUT_S=${TIMEOUT_S:-10}
RSS_MB=${RSS_MB:-1024}
ALL=(frame_decoder http_rooms http_tickets http_trajectory resume)
targets=("$@")
((${#targets[@]})) || targets=("${ALL[@]}")

host=$(rustc -vV | sed -n 's/^host: //p')
# --target keeps the instrumentation off build scripts and proc macros (they run in the build).
RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing" \
  cargo build --release --locked --bins --target "$host"
bin="target/$host/release"

seed() {
  local target=$1 dir=corpus/$1
  mkdir -p "$dir"
  if [ "$target" = frame_decoder ]; then
    # Each client vector's frame, as a client sends it (and the refused ones too).
    for f in ../protocol/vectors/client/*.json; do
      python3 -c 'import json, sys; sys.stdout.write(json.dumps(json.load(open(sys.argv[1]))["frame"]))' \
        "$f" >"$dir/vector-$(basename "$f" .json)"
    done
  else
    cp seeds/"$target"/* "$dir"/
  fi
}

summary=()
status=0
for t in "${targets[@]}"; do
  seed "$t"
  mkdir -p "artifacts/$t"
  log=$(mktemp)
  start=$(date +%s)
  set +e
  "$bin/$t" "corpus/$t" -runs="$RUNS" -timeout="$TIMEOUT_S" -rss_limit_mb="$RSS_MB" \
    -max_len=65536 -artifact_prefix="artifacts/$t/" -print_final_stats=1 >"$log" 2>&1
  code=$?
  set -e
  secs=$(($(date +%s) - start))
  stat() { sed -n "s/^stat::$1: *//p" "$log" | tail -1; }
  if [ "$code" -eq 0 ]; then
    runs=$(stat number_of_executed_units)
    summary+=("$t: ${runs} inputs in ${secs} s ($((runs / (secs > 0 ? secs : 1)))/s), peak RSS $(stat peak_rss_mb) MB, slowest input $(stat slowest_unit_time_sec) s, corpus $(ls "corpus/$t" | wc -l) inputs: no finding")
  else
    tail -40 "$log"
    summary+=("$t: FINDING after ${secs} s (exit $code): see fuzz/artifacts/$t/")
    status=1
  fi
  rm -f "$log"
done
printf '%s\n' "${summary[@]}"
exit "$status"
