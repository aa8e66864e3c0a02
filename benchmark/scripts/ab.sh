#!/usr/bin/env bash
# Paired comparison of two builds' CPU per task: this work tree against REV, on the
# throughput benchmark's load (8 simulated agents in one process with GOMAXPROCS=1,
# zero load and run time, wrk with ../shared/tools/relay-limit/post.lua, fresh tasks).
# Each pair starts one build's stack, warms it, measures one wrk run, stops it, then
# does the same for the other build; who goes first alternates. On a shared machine
# whose speed drifts by tens of percent, a difference that holds in (nearly) every
# pair is worth more than any single run's req/s.
#   benchmark/scripts/ab.sh REV [PAIRS] [DURATION]      e.g. ab.sh HEAD~3 5 5s
# Environment: SLOTS per agent (8), CONNECTIONS (64); OLD_FLAGS and NEW_FLAGS, extra
# dispatcher flags for REV's build and this tree's (word-split), so that one build can be
# compared with itself under two settings: NEW_FLAGS='--gc-percent 400' ab.sh HEAD 8 5s.
# DISPATCHER_GOMEMLIMIT (921MiB, as in throughput.sh and the chart, so the GC target is
# 800 unless a flag says otherwise; empty or off for none, and so 200).
# Needs wrk.
set -euo pipefail
cd "$(dirname "$0")/../.."
REV=${1:?usage: ab.sh REV [PAIRS] [DURATION]}; PAIRS=${2:-5}; DURATION=${3:-5s}
CONNS=${CONNECTIONS:-64}; SLOTS=${SLOTS:-8}; MEMLIMIT=${DISPATCHER_GOMEMLIMIT-921MiB}
LUA=${RELAY_DIR:-../shared/tools/relay-limit}/post.lua
command -v wrk >/dev/null || { echo "wrk not found: apt-get install wrk" >&2; exit 1; }
[ -f "$LUA" ] || { echo "post.lua not found at $LUA (set RELAY_DIR)" >&2; exit 1; }
LUA=$(realpath "$LUA")
TMP=$(mktemp -d)
cleanup() { kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null; git worktree remove --force "$TMP/rev" 2>/dev/null || true; rm -rf "$TMP"; }
trap cleanup EXIT
mkdir -p "$TMP/new" "$TMP/old"
go build -o "$TMP/new/" ./dispatcher/cmd/dispatcher ./worker-agent/cmd/worker-agent
git worktree add -q --detach "$TMP/rev" "$REV"
(cd "$TMP/rev" && go build -o "$TMP/old/" ./dispatcher/cmd/dispatcher ./worker-agent/cmd/worker-agent)

ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
HZ=$(getconf CLK_TCK)
# measure DIR prints: dispatcher-µs agents-µs total-µs req/s
measure() {
  local bin=$1 d a n
  local -a flags
  read -r -a flags <<<"$2"
  rm -rf "$TMP/data"
  GOMEMLIMIT="${MEMLIMIT:-off}" "$bin/dispatcher" --addr 127.0.0.1:18380 --log-level warn --task-retention 1s --data-dir "$TMP/data" "${flags[@]}" >"$TMP/d.log" 2>&1 &
  d=$!
  GOMAXPROCS=1 "$bin/worker-agent" --dispatcher-url ws://127.0.0.1:18380/worker-listen --worker-id ab --agents 8 \
    --slots "$SLOTS" --max-labels 5 --sim-load-time 0 --sim-run-time 0 --log-level warn >"$TMP/a.log" 2>&1 &
  a=$!
  # measure runs in a subshell (read < <(measure ...)), out of the script's cleanup's
  # reach: a failed wrk or readiness must not leave this stack running.
  trap "kill -TERM $d $a 2>/dev/null || true" EXIT
  for _ in $(seq 1 100); do
    n=$(curl -sf http://127.0.0.1:18380/workers | grep -o 'ab-' | wc -l || true)
    [ "$n" = 8 ] && break
    sleep 0.1
  done
  if [ "$n" != 8 ]; then
    echo "not ready: $n/8 agents on the dispatcher" >&2; cat "$TMP/d.log" "$TMP/a.log" >&2; exit 1
  fi
  wrk -t2 -c"$CONNS" -d2s -s "$LUA" http://127.0.0.1:18380/run-task >/dev/null
  sleep 1.2 # past the 1 s retention: the measured run's ids are fresh
  local d0 a0 out
  d0=$(ticks $d); a0=$(ticks $a)
  out=$(wrk -t2 -c"$CONNS" -d"$DURATION" -s "$LUA" http://127.0.0.1:18380/run-task)
  awk -v d=$(( $(ticks $d) - d0 )) -v a=$(( $(ticks $a) - a0 )) -v hz="$HZ" \
    '/requests in/{n=$1} /Requests\/sec/{r=$2} END{printf "%.1f %.1f %.1f %s\n", d*1e6/hz/n, a*1e6/hz/n, (d+a)*1e6/hz/n, r}' <<<"$out"
  kill -TERM $d $a; wait $d $a 2>/dev/null || true
}

printf '%-5s %-12s %-12s %-12s %-12s %s\n' pair "$REV" this "$REV req/s" "this req/s" "this cheaper"
wins=0; sum_old=0; sum_new=0
for p in $(seq 1 "$PAIRS"); do
  if (( p % 2 )); then
    read -r _ _ o or < <(measure "$TMP/old" "${OLD_FLAGS:-}"); read -r _ _ w wr < <(measure "$TMP/new" "${NEW_FLAGS:-}")
  else
    read -r _ _ w wr < <(measure "$TMP/new" "${NEW_FLAGS:-}"); read -r _ _ o or < <(measure "$TMP/old" "${OLD_FLAGS:-}")
  fi
  cheaper=$(awk -v o="$o" -v w="$w" 'BEGIN{print (w < o) ? "yes" : "no"}')
  [ "$cheaper" = yes ] && wins=$((wins + 1))
  sum_old=$(awk -v s="$sum_old" -v x="$o" 'BEGIN{print s+x}'); sum_new=$(awk -v s="$sum_new" -v x="$w" 'BEGIN{print s+x}')
  printf '%-5s %-12s %-12s %-12s %-12s %s\n' "$p" "$o µs" "$w µs" "$or" "$wr" "$cheaper"
done
awk -v o="$sum_old" -v w="$sum_new" -v n="$PAIRS" -v k="$wins" -v rev="$REV" \
  'BEGIN{printf "CPU per task (dispatcher + agents), mean: %s %.1f µs, this tree %.1f µs (%+.1f%%); this tree cheaper in %d of %d pairs\n", rev, o/n, w/n, (w-o)/o*100, k, n}'
