#!/usr/bin/env bash
# Starts a dispatcher and NUM_WORKERS agents (simulated backend) from ./bin; Ctrl-C
# stops them all (SIGTERM: agents drain, the dispatcher finishes in-flight tasks).
#   NUM_WORKERS=2 RANDOM_DISPATCH=false scripts/run-local.sh
set -euo pipefail
cd "$(dirname "$0")/.."
NUM_WORKERS=${NUM_WORKERS:-2}
export RANDOM_DISPATCH=${RANDOM_DISPATCH:-false}
for b in dispatcher worker-agent; do
  [ -x "bin/$b" ] || { echo "bin/$b missing: run 'task build' first" >&2; exit 1; }
done
pids=()
stop() { kill -TERM "${pids[@]}" 2>/dev/null || true; wait; }
trap stop EXIT INT TERM
bin/dispatcher & pids+=($!)
for i in $(seq 1 "$NUM_WORKERS"); do
  bin/worker-agent --worker-id "worker-$i" & pids+=($!)
done
wait
