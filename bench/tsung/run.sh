#!/usr/bin/env bash
# Source document 004's capacity test with the tool it used: Tsung drives a local `plaza serve`
# over WebSocket (bench/tsung/capacity.xml). Users arrive at RATE per second for ARRIVAL_S
# seconds, join one room and idle; then one message is published and timed to every member.
#
#   bench/tsung/run.sh RATE [ARRIVAL_S]        e.g. bench/tsung/run.sh 10        (the document: 10, 20, 40, 80; 300 s)
#
# Environment: BIN (the plaza binary, default target/release/plaza), PORT (7700), SERVER_CPU (0) and
# TSUNG_CPU (1) for taskset, OUT (default /tmp/plaza-tsung-RATE), SERVE_ARGS (more `plaza serve`
# arguments, e.g. "--max-connections 5000"), HOLD_S (20: how long the announcer stays after its
# message; the test ends then), ALLOW_REFUSED=1 (an availability run: refusals are expected).
# Exit status 0 when every member held received the broadcast and Tsung counted no error
# (refusals aside with ALLOW_REFUSED=1), 3 when not, 4 when Tsung itself did not carry out the
# scenario (its announcer never sent the publish, or with ALLOW_REFUSED=1 its launcher fell too
# far behind to go over the limit: nothing was asked of the server, so nothing about it is
# known), 1 or 2 when the test could not run.
# Needs tsung (Debian: apt-get install tsung) and curl. Prints a summary and writes it, with
# Tsung's logs and the server's RSS samples, under OUT.
set -euo pipefail
cd "$(dirname "$0")/../.."

rate=${1:?usage: bench/tsung/run.sh RATE [ARRIVAL_S]}
arrival_s=${2:-300}
plaza=${BIN:-target/release/plaza}
port=${PORT:-7700}
out=${OUT:-/tmp/plaza-tsung-$rate}
room=capacity
hold_s=${HOLD_S:-20}

command -v tsung >/dev/null || { echo "tsung is missing: apt-get install tsung" >&2; exit 2; }
[ -x "$plaza" ] || { echo "$plaza is missing: cargo build --release -p plaza" >&2; exit 2; }
rm -rf "$out"
mkdir -p "$out"

# Tsung starts its client VMs on this host by name (Erlang's node name), without ssh.
host=$(uname -n)
# The announcer arrives at 0 and waits in steps of 5 s; it speaks at least 5 s after the last
# arrival (at 1 + arrival_s).
waits=$(((1 + arrival_s + 5 + 4) / 5))
speak_at=$((waits * 5))
sed -e "s/@RATE@/$rate/g" -e "s/@ARRIVAL_S@/$arrival_s/g" \
  -e "s/@LOAD_S@/$((speak_at + hold_s + 10))/g" -e "s/@HOLD_S@/$hold_s/g" \
  -e "s/@ANNOUNCER_WAITS@/$waits/g" \
  -e "s/@HOST@/$host/g" -e "s/@MAXUSERS@/9000/g" -e "s/@ROOM@/$room/g" \
  -e "s/@SERVER_IP@/127.0.0.1/g" -e "s/@SERVER_PORT@/$port/g" \
  bench/tsung/capacity.xml >"$out/capacity.xml"

# shellcheck disable=SC2086
PLAZA_LOG=warn taskset -c "${SERVER_CPU:-0}" "$plaza" serve --listen "127.0.0.1:$port" \
  ${SERVE_ARGS:-} >"$out/plaza.log" 2>&1 &
server=$!
sampler=
cleanup() {
  [ -n "$sampler" ] && kill "$sampler" 2>/dev/null || true
  kill "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
}
trap cleanup EXIT
up=
for _ in $(seq 100); do
  kill -0 "$server" 2>/dev/null || { echo "plaza exited: see $out/plaza.log" >&2; exit 1; }
  if curl -sf "http://127.0.0.1:$port/healthz" >/dev/null; then up=1; break; fi
  sleep 0.1
done
# (Also: a server already on the port would answer while ours failed to bind.)
sleep 0.2
if [ -z "$up" ] || ! kill -0 "$server" 2>/dev/null; then
  echo "plaza did not start on port $port: see $out/plaza.log" >&2
  exit 1
fi
# Without presence events (each join would reach every member: O(n²)), and room for everyone.
curl -sf -X POST "http://127.0.0.1:$port/v1/rooms" -H 'content-type: application/json' \
  -d "{\"id\": \"$room\", \"options\": {\"presence\": false, \"max_members\": 1000000}}" >/dev/null ||
  { echo "could not create the room" >&2; exit 1; }

# The server's RSS (KiB) and open connections, every second: unix time, rss, connections.
(
  # A sample that fails (a busy moment) is a gap, not the end of sampling.
  set +e +o pipefail
  while kill -0 "$server" 2>/dev/null; do
    rss=$(awk '/^VmRSS/ {print $2}' "/proc/$server/status" 2>/dev/null || echo 0)
    conns=$(curl -s --max-time 1 "http://127.0.0.1:$port/metrics" | awk '$1 == "plaza_connections" {print $2}')
    echo "$(date +%s.%N) $rss ${conns:-?}"
    sleep 1
  done
) >"$out/server.tsv" &
sampler=$!

start=$(date +%s)
taskset -c "${TSUNG_CPU:-1}" tsung -f "$out/capacity.xml" -l "$out" start >"$out/tsung.out" 2>&1 || true
log=$(find "$out" -name tsung.log | head -1)
dump=$(find "$out" -name tsung.dump | head -1)
[ -n "$log" ] && [ -n "$dump" ] || { echo "tsung left no log: see $out/tsung.out" >&2; exit 1; }
refused=$(curl -s "http://127.0.0.1:$port/metrics" | awk '$1 == "plaza_connections_refused_total" {print $2}' || true)
healthy=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/healthz" || true)

# The broadcast: the announcer is the user that got an `ack`; its publish is its last send
# before that. Every other user's first `event` is its receipt. Times are Tsung's, in seconds.
awk -F: '
  /^Send:/ { last_send[$3] = $2 }
  /^Recv:/ && /"type":"ack"/ && !sent { sent = last_send[$3]; announcer = $3 }
  /^Recv:/ && /"type":"event"/ && !($3 in got) { got[$3] = $2 }
  END { if (sent) for (p in got) if (p != announcer) printf "%.3f\n", (got[p] - sent) * 1000 }' "$dump" |
  sort -n >"$out/broadcast-ms.txt"
awk '{ d[NR] = $1 } END {
    if (NR == 0) { print "received by 0 members"; exit }
    p50 = int(NR * 0.50); if (p50 < 1) p50 = 1
    p99 = int(NR * 0.99); if (p99 < 1) p99 = 1
    printf "received by %d members: first %.1f ms, p50 %.1f ms, p99 %.1f ms, last %.1f ms\n", NR, d[1], d[p50], d[p99], d[NR]
  }' "$out/broadcast-ms.txt" >"$out/broadcast.txt"
broadcast=$(cat "$out/broadcast.txt")

# Tsung's counters: the run's total of each error kind and of WebSocket handshakes, and the
# most concurrent users and connections (the lines are "stats: NAME INTERVAL TOTAL", and for
# users and connected "stats: NAME NOW MAX"). `error_abort` is the controller stopping the
# sessions still idling when the load's duration is over: the planned end, counted once.
stats=$(awk '/^stats: / { v[$2] = $4; if ($2 == "users" || $2 == "connected") if ($4 > max[$2]) max[$2] = $4 }
  END { for (k in v) if (k ~ /^error/ || k ~ /^websocket/) printf "%s=%s ", k, v[k];
        printf "users_started=%s max_users=%s max_connected=%s", v["users_count"], max["users"], max["connected"] }' "$log")

# RSS: at the start and just before the broadcast (the last sample before arrivals ended).
rss_start=$(awk 'NR == 1 {print $2}' "$out/server.tsv")
# (Tsung's times and the samples' are both unix time.)
announced=$(awk -F: '/^Send:/ { last[$3] = $2 } /^Recv:/ && /"type":"ack"/ { print int(last[$3]); exit }' "$dump")
read -r rss_held conns_held < <(awk -v t="${announced:-$((start + speak_at))}" '$1 <= t {r = $2; c = $3} END {print r, c}' "$out/server.tsv")
# The document's "MTBF": how long the node took every connection before it refused one.
first_refusal=$(awk -F: '/^Send:/ && !t0 { t0 = $2 } /^Recv:/ && /HTTP\/1.1 503/ { printf "%.1f", $2 - t0; exit }' "$dump")
rss_max=$(awk '$2 > m {m = $2} END {print m}' "$out/server.tsv")
per_conn=$(awk -v a="$rss_start" -v b="$rss_held" -v c="$conns_held" 'BEGIN { if (c + 0 > 0) printf "%.2f", (b - a) / c; else print "?" }')

{
  echo "rate=$rate/s arrival_s=$arrival_s"
  echo "connections held (plaza_connections before the broadcast): $conns_held"
  echo "tsung: $stats"
  echo "refused by plaza (503 server_full): ${refused:-0}${first_refusal:+, the first $first_refusal s after the first arrival}; /healthz after: $healthy"
  echo "server RSS KiB: start $rss_start, before the broadcast $rss_held, max $rss_max; per connection $per_conn KiB"
  echo "broadcast: $broadcast"
} | tee "$out/summary.txt"

count() { awk -v k="$1" '/^stats: / && $2 == k { v = $4 } END { print v + 0 }' "$log"; }
handshakes=$(count websocket_succ)
received=$(awk 'END { print NR }' "$out/broadcast-ms.txt")
# Tsung counts a refused handshake twice: websocket_fail and error_unknown.
errors=$(awk '/^stats: error_/ && $2 != "error_abort" && $2 != "error_unknown" { v[$2] = $4 }
  END { s = 0; for (k in v) s += v[k]; print s }' "$log")
failed=$(count websocket_fail)
unknown=$(count error_unknown)
# Error frames Plaza sent to any user (a join or ping refused, say).
error_frames=$(grep -a -c '^Recv:.*"type":"error"' "$dump" || true)
# Whether Tsung sent the announcer's publish. Without it no member could receive anything: on a
# busy machine Tsung sometimes stalls a session between two of its own steps (its dump then
# shows the announcer's earlier pings answered and nothing after). The announcer is the first
# user (it arrives at 0) and sends the upgrade, its join, a ping per wait, then the publish;
# the frames themselves are masked in the dump, so they are counted, not read.
announcer=$(awk -F: '/^Send:/ { print $3; exit }' "$dump")
announcer_sends=$(awk -F: -v p="$announcer" '/^Send:/ && $3 == p { n++ } END { print n + 0 }' "$dump")
if [ "$announcer_sends" -lt $((waits + 3)) ]; then
  echo "NOT RUN: Tsung's announcer sent $announcer_sends of its $((waits + 3)) messages, not its publish" \
    "(see $dump); the server was not tested" >&2
  exit 4
fi
# An availability run must go over the limit. When Tsung's launcher fell behind its arrival rate
# (it says so in its node's log) and nothing was refused, Tsung never sent the connections that
# would have gone over it: nothing was asked of the server's limit, so nothing about it is known.
launcher_log=$(find "$out" -name 'tsung0@*.log' | head -1)
if [ "${ALLOW_REFUSED:-0}" = 1 ] && [ "${refused:-0}" -eq 0 ] && [ "$failed" -eq 0 ] &&
  [ -n "$launcher_log" ] && grep -q "were not launched in time" "$launcher_log"; then
  echo "NOT RUN: Tsung's launcher fell behind (see $launcher_log) and started $handshakes users," \
    "not enough to go over the limit; the server was not tested" >&2
  exit 4
fi
status=0
if [ "$error_frames" -ne 0 ]; then
  echo "FAILED: $error_frames error frames from plaza (see $dump)" >&2
  status=3
fi
if [ "$received" -ne $((handshakes - 1)) ]; then
  echo "FAILED: $received of $((handshakes - 1)) members received the broadcast" >&2
  status=3
fi
if [ "${ALLOW_REFUSED:-0}" = 1 ]; then
  # Every failed handshake is a refusal Plaza counted, and nothing else failed.
  if [ "${refused:-0}" -eq 0 ] || [ "$failed" -ne "${refused:-0}" ] || [ "$unknown" -ne "$failed" ] ||
    [ "$errors" -ne 0 ]; then
    echo "FAILED: $failed handshakes failed, $errors other errors, ${refused:-0} refusals by plaza" >&2
    status=3
  fi
elif [ "$((errors + failed + unknown))" -ne 0 ] || [ "${refused:-0}" != 0 ]; then
  echo "FAILED: $errors errors, $failed failed handshakes, ${refused:-0} refusals" >&2
  status=3
fi
[ "$healthy" = 200 ] || { echo "FAILED: /healthz answered $healthy after the test" >&2; status=3; }
exit "$status"
