#!/usr/bin/env bash
# Dispatcher throughput against the relay ceiling (../shared/tools/relay-limit), measured
# in one run with the same wrk and post.lua, alternating ROUNDS times so that noise on a
# shared machine hits both alike. Agents use the simulated backend with zero load and
# run time and log only warnings, like the relay's in-process workers. Environment:
# WORKERS (8), SLOTS per agent (1), AGENT_PROCS (1: all agents in one process),
# SERVER_GOMAXPROCS (unset: Go's default) for the dispatcher and the relay alike;
# DISPATCHER_GOMEMLIMIT (921MiB: what the chart's 1 GiB container limit gives it; empty
# or off for none, which also puts its GC target back to 200, whatever the caller's
# GOMEMLIMIT or cgroup).
#   benchmark/scripts/throughput.sh [ROUNDS] [DURATION] [CONNECTIONS]
# Besides req/s and latency, each row has the CPU time per request (µs, from /proc) of
# our dispatcher and agents and of the whole relay: on a shared machine it is the
# steadier measure of what each costs. disp_cpu is the dispatcher's share alone: in a
# deployment the agents run on their own machines, so it is what the dispatcher's host
# pays per task (the relay's figure still includes its in-process workers).
# Needs wrk (apt-get install wrk).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${1:-3}; DURATION=${2:-10s}; CONNS=${3:-64}; WORKERS=${WORKERS:-8}
RELAY_DIR=${RELAY_DIR:-../shared/tools/relay-limit}
command -v wrk >/dev/null || { echo "wrk not found: apt-get install wrk" >&2; exit 1; }
[ -d "$RELAY_DIR" ] || { echo "relay-limit not found at $RELAY_DIR (set RELAY_DIR)" >&2; exit 1; }
BIN=$(mktemp -d); trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null; rm -rf "$BIN"' EXIT
go build -o "$BIN/" ./dispatcher/cmd/dispatcher ./worker-agent/cmd/worker-agent
(cd "$RELAY_DIR" && GOWORK=off go build -o "$BIN/relay-limit" .)
LUA="$RELAY_DIR/post.lua"

# post.lua numbers its task ids afresh on every wrk run, and the dispatcher answers an id
# it has answered within --task-retention from memory without running it again (the
# idempotency producers rely on). With the default 10 minutes, later rounds measured
# that cache, not routing. A 1s retention still pays for keeping every answer, and no
# round reuses an id from an earlier one.
server_env=(); [ -n "${SERVER_GOMAXPROCS:-}" ] && server_env=(GOMAXPROCS="$SERVER_GOMAXPROCS")
# The dispatcher runs under the soft memory limit the chart's container gives it (90% of
# 1 GiB), and so at the GC target it has there (800, not 200: README "Memory and GC").
# GOMEMLIMIT=off, not an unset one, for none: the dispatcher then reads no cgroup limit.
MEMLIMIT=${DISPATCHER_GOMEMLIMIT-921MiB}
disp_env=("${server_env[@]}" GOMEMLIMIT="${MEMLIMIT:-off}")
env "${disp_env[@]}" "$BIN/dispatcher" --addr 127.0.0.1:18080 --log-level warn --data-dir "$BIN/data" --task-retention 1s >"$BIN/dispatcher.log" 2>&1 &
OURS_PIDS=$!
DISP_PID=$!
# Agents run in one process (--agents), as the relay's workers run inside the relay;
# AGENT_PROCS=$WORKERS runs one process per agent instead. Each agent process gets
# GOMAXPROCS=1, as in the Helm chart, whose agent container is limited to one CPU
# (Go sets GOMAXPROCS from that limit); AGENT_GOMAXPROCS overrides it.
AGENT_PROCS=${AGENT_PROCS:-1}
per=$(( WORKERS / AGENT_PROCS ))
for p in $(seq 1 "$AGENT_PROCS"); do
  GOMAXPROCS=${AGENT_GOMAXPROCS:-1} "$BIN/worker-agent" --dispatcher-url ws://127.0.0.1:18080/worker-listen --worker-id tp-$p --agents "$per" \
    --slots "${SLOTS:-1}" --max-labels 5 --sim-load-time 0 --sim-run-time 0 --log-level warn >"$BIN/agent-$p.log" 2>&1 &
  OURS_PIDS="$OURS_PIDS $!"
done
env "${server_env[@]}" "$BIN/relay-limit" -addr 127.0.0.1:18099 -workers "$WORKERS" >"$BIN/relay.log" 2>&1 &
RELAY_PIDS=$!
# Readiness: our /workers lists every agent, and the relay says its workers are in.
# (Never probe the relay with a request before that: a request that finds no relay
# worker panics while holding the relay's lock and deadlocks it.)
for _ in $(seq 1 300); do
  n=$(curl -sf http://127.0.0.1:18080/workers | grep -o tp- | wc -l || true)
  [ "$n" = "$WORKERS" ] && grep -q "workers connected" "$BIN/relay.log" && break
  sleep 0.1
done
if [ "$n" != "$WORKERS" ] || ! grep -q "workers connected" "$BIN/relay.log"; then
  echo "not ready: $n/$WORKERS agents on the dispatcher; relay log:" >&2; cat "$BIN/relay.log" "$BIN/dispatcher.log" >&2; exit 1
fi

# CPU time (user+system, clock ticks) of a set of processes, from /proc: the cost per
# request is steadier than req/s on a shared machine, where other load takes cycles.
ticks() { local t=0; for p in $1; do t=$(( t + $(awk '{print $14+$15}' "/proc/$p/stat") )); done; echo "$t"; }
HZ=$(getconf CLK_TCK)
# rate URL PIDS [PID] prints: req/s p50 p99 non-2xx cpu-µs-per-request of PIDS, and of
# PID alone (0 without one)
rate() {
  local t0 t1 s0=0 s1=0 out
  t0=$(ticks "$2"); [ -n "${3:-}" ] && s0=$(ticks "$3")
  out=$(wrk -t2 -c"$CONNS" -d"$DURATION" --latency -s "$LUA" "$1" | tee -a "$BIN/wrk.txt")
  t1=$(ticks "$2"); [ -n "${3:-}" ] && s1=$(ticks "$3")
  echo "$out" | awk -v dt=$(( t1 - t0 )) -v ds=$(( s1 - s0 )) -v hz="$HZ" '/requests in/{n=$1} /Requests\/sec/{r=$2} /^ +50%/{p50=$2} /^ +99%/{p99=$2} /Non-2xx/{bad=$4}
    END{printf "%s %s %s %s %.1f %.1f\n", r, p50, p99, bad+0, dt*1e6/hz/n, ds*1e6/hz/n}'
}
# Warm both up so that the first round is not paying for page faults and JIT-free cold caches.
wrk -t2 -c"$CONNS" -d2s -s "$LUA" http://127.0.0.1:18080/run-task >/dev/null
wrk -t2 -c"$CONNS" -d2s -s "$LUA" http://127.0.0.1:18099/run-task >/dev/null
row='%-6s %-10s %-9s %-9s %-8s %-9s %-9s %-10s %-9s %-9s %-9s %-7s %-9s %s\n'
printf "$row" round ours_rps ours_p50 ours_p99 ours_err ours_cpu disp_cpu relay_rps relay_p50 relay_p99 relay_cpu ratio cpu_ratio disp_cpu_ratio
sum_ratio=0; sum_cpu=0; sum_disp=0; ratios=
for r in $(seq 1 "$ROUNDS"); do
  # Who goes first alternates, so that a machine slowing down or speeding up over the
  # run does not favour one side.
  if (( r % 2 )); then
    read -r o50 o_p50 o_p99 o_err o_cpu d_cpu < <(rate http://127.0.0.1:18080/run-task "$OURS_PIDS" "$DISP_PID")
    read -r r50 r_p50 r_p99 r_err r_cpu _ < <(rate http://127.0.0.1:18099/run-task "$RELAY_PIDS")
  else
    read -r r50 r_p50 r_p99 r_err r_cpu _ < <(rate http://127.0.0.1:18099/run-task "$RELAY_PIDS")
    read -r o50 o_p50 o_p99 o_err o_cpu d_cpu < <(rate http://127.0.0.1:18080/run-task "$OURS_PIDS" "$DISP_PID")
  fi
  ratio=$(awk -v a="$o50" -v b="$r50" 'BEGIN{printf "%.3f", a/b}')
  cpu_ratio=$(awk -v a="$r_cpu" -v b="$o_cpu" 'BEGIN{printf "%.3f", a/b}')
  disp_ratio=$(awk -v a="$r_cpu" -v b="$d_cpu" 'BEGIN{printf "%.3f", a/b}')
  ratios="$ratios $ratio"
  sum_ratio=$(awk -v s="$sum_ratio" -v x="$ratio" 'BEGIN{print s+x}')
  sum_cpu=$(awk -v s="$sum_cpu" -v x="$cpu_ratio" 'BEGIN{print s+x}')
  sum_disp=$(awk -v s="$sum_disp" -v x="$disp_ratio" 'BEGIN{print s+x}')
  printf "$row" "$r" "$o50" "$o_p50" "$o_p99" "$o_err" "$o_cpu" "$d_cpu" "$r50" "$r_p50" "$r_p99" "$r_cpu" "$ratio" "$cpu_ratio" "$disp_ratio"
done
awk -v s="$sum_ratio" -v c="$sum_cpu" -v d="$sum_disp" -v n="$ROUNDS" 'BEGIN{printf "mean ratio ours/relay: %.3f req/s, %.3f CPU per request (relay/ours), %.3f (relay/dispatcher alone) over %d rounds\n", s/n, c/n, d/n, n}'
# The median and range of the req/s ratio: one round can be far off on a shared machine.
# The standard error of the mean says how far the mean itself may be off: with the
# rounds' spread on a shared host, a mean within about two of them of a goal has not
# shown whether it meets it.
echo "$ratios" | tr ' ' '\n' | grep . | sort -n | awk '{v[NR]=$1; s+=$1; q+=$1*$1} END{m=(NR%2)?v[(NR+1)/2]:(v[NR/2]+v[NR/2+1])/2;
  se=(NR>1)?sqrt((q-s*s/NR)/(NR-1)/NR):0; printf "median req/s ratio %.3f (min %.3f, max %.3f); mean %.3f, standard error %.3f\n", m, v[1], v[NR], s/NR, se}'
