#!/usr/bin/env bash
# Dispatcher memory per connected worker: start a dispatcher, read its memory, connect
# N idle agents (one agent process, --agents N), read it again once all are registered,
# and divide. "live" is heap in use plus goroutine stacks after a forced GC (read from
# the dispatcher's --pprof-addr); RSS is reported beside it. Then one task per label
# runs through the full fleet.
#   benchmark/scripts/scale.sh [N]        (default 10000; needs `ulimit -n` above N)
set -euo pipefail
cd "$(dirname "$0")/../.."
N=${1:-10000}
BIN=$(mktemp -d); trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null; rm -rf "$BIN"' EXIT
go build -o "$BIN/" ./dispatcher/cmd/dispatcher ./worker-agent/cmd/worker-agent
ADDR=127.0.0.1:18280
PPROF=${PPROF:-127.0.0.1:18281}
"$BIN/dispatcher" --addr $ADDR --pprof-addr $PPROF --log-level warn --data-dir "$BIN/data" >"$BIN/dispatcher.log" 2>&1 &
DPID=$!
until curl -sf http://$ADDR/health >/dev/null; do sleep 0.1; done
rss() { awk '/VmRSS/{print $2}' /proc/$DPID/status; }
# Live memory after a forced GC: heap in use plus goroutine stacks, in KiB.
live() { curl -s "http://$PPROF/debug/pprof/heap?debug=1&gc=1" |
  awk '/^# HeapInuse = /{h=$4} /^# Stack = /{s=$4} END{printf "%d", (h+s)/1024}'; }
before=$(rss); live_before=$(live)
"$BIN/worker-agent" --dispatcher-url ws://$ADDR/worker-listen --worker-id scale --agents "$N" \
  --sim-load-time 0 --sim-run-time 0 --log-level warn >"$BIN/agents.log" 2>&1 &
start=$(date +%s.%N)
while :; do
  n=$(curl -sf http://$ADDR/workers | grep -o 'scale-' | wc -l || true)
  [ "$n" -ge "$N" ] && break
  sleep 0.5
done
connected=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN{printf "%.1f", e-s}')
# The connection burst leaves garbage and the stacks of the upgrade handlers, which end
# as each reader starts: a single forced GC right away measured some of them (the
# same build read 11-19 KiB per worker). Let the handlers end, then take the least of
# three readings a second apart, each after its own forced GC.
sleep 1
live_after=$(live); for _ in 1 2; do sleep 1; l=$(live); (( l < live_after )) && live_after=$l; done
after=$(rss)
for i in 1 2 3 4 5; do
  curl -sf -o /dev/null http://$ADDR/run-task -d "{\"task_type\":\"t\",\"label\":\"label-$i\"}"
done
[ -n "${PPROF_OUT:-}" ] && curl -s -o "$PPROF_OUT" "http://$PPROF/debug/pprof/heap?gc=1"
echo "workers=$N connect_s=$connected live_kib_before=$live_before live_kib_after=$live_after live_per_worker_kib=$(awk -v a=$live_after -v b=$live_before -v n=$N 'BEGIN{printf "%.1f", (a-b)/n}')"
echo "rss_kib_before=$before rss_kib_after=$after rss_per_worker_kib=$(awk -v a=$after -v b=$before -v n=$N 'BEGIN{printf "%.1f", (a-b)/n}') (RSS includes garbage of the connection burst not yet returned to the OS)"
