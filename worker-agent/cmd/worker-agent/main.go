// Command worker-agent connects to a smartroute dispatcher and runs the tasks it
// assigns on an inference backend, holding at most --max-labels labels (models) at once.
//
// Flags (each also read from the environment variable in brackets; a flag given on the
// command line wins over the variable, which wins over the default):
//
//	--dispatcher-url   [DISPATCHER_URL]   ws://127.0.0.1:8080/worker-listen
//	--worker-id        [WORKER_ID]        host name plus a short random suffix
//	--worker-token     [WORKER_TOKEN]     none: bearer token sent to the dispatcher and the log collector
//	--ca-file          [CA_FILE]          none: PEM CAs trusted for wss:// and https:// URLs (default: system roots)
//	--max-labels       [MAX_LABELS]       2: labels held at once
//	--slots            [SLOTS]            1: tasks run at once
//	--labels           [LABELS]           comma-separated labels this worker may load; empty: any
//	--backend          [BACKEND]          sim, or triton (any other name is a startup error)
//	--triton-url       [TRITON_URL]       http://127.0.0.1:8000: Triton's HTTP endpoint (triton backend)
//	--triton-load-timeout   [TRITON_LOAD_TIMEOUT]   10m: bound of one model load
//	--triton-unload-timeout [TRITON_UNLOAD_TIMEOUT] 2m: bound of one unload, until the model leaves UNLOADING
//	--triton-start-timeout  [TRITON_START_TIMEOUT]  5m: wait at start for Triton to be live and no model LOADING, then exit 1
//	--triton-text-input     [TRITON_TEXT_INPUT]     TEXT: BYTES input embed_texts fills
//	--triton-embedding-output [TRITON_EMBEDDING_OUTPUT] sentence_embedding: FP32 output embed_texts returns
//	--inventory-interval    [INVENTORY_INTERVAL]    30s: how often the triton backend reads the repository index for models added or removed
//	--sim-load-time    [SIM_LOAD_TIME]    400ms: simulated load time
//	--sim-load-jitter  [SIM_LOAD_JITTER]  0: largest ± deviation of a load time, drawn uniformly
//	--sim-run-time     [SIM_RUN_TIME]     40ms: simulated run time
//	--sim-run-jitter   [SIM_RUN_JITTER]   0: largest ± deviation of a run time, drawn uniformly
//	--seed             [SEED]             1: seed of the jitter; the same seed gives the same durations
//	--log-level        [LOG_LEVEL]        info: debug, info, warn or error (JSON lines on stdout)
//	--drain-timeout    [DRAIN_TIMEOUT]    30s: how long a drain (SIGTERM, or the dispatcher's) waits for in-flight tasks
//	--log-collector-url [LOG_COLLECTOR_URL] none: stream logs to a log collector (ws://HOST:8090/ingest) as well as stdout
//	--agents           [AGENTS]           1: agents in this process, named <worker-id>-1..N (load tests)
//	--cpu-prof         [CPU_PROF]         none: write a pprof CPU profile here on exit
//	--metrics-addr     [METRICS_ADDR]     none: serve /metrics, /healthz and /readyz here (e.g. :9100)
//	--pprof            [PPROF]            false: also serve /debug/pprof/ on --metrics-addr
//
// A flag, environment variable or configuration it refuses exits 2; a failure at run
// time exits 1.
//
// SIGTERM or SIGINT drains: the worker takes no new tasks, waits up to --drain-timeout
// for those in flight, sends their results, closes the connection normally and exits 0.
// A second signal kills it at once. A Drain frame from the dispatcher does the same.
//
// When the dispatcher closes the connection, the close code decides what happens next:
// REPLACED (4004) and PROTOCOL_VERSION (4001) make the worker give up and exit 1
// saying why; SLOW_WORKER (4003) reconnects at once; an upgrade refused with HTTP
// 401/403 or UNAUTHORIZED (4005) is logged at error level ("the dispatcher refused
// this worker's token") and retried, so the fleet recovers once the token is fixed;
// those, SHUTDOWN (4000), BAD_FRAME (4002),
// HELLO_TIMEOUT (4006), any other code and network errors reconnect after an
// exponential backoff (100ms doubling to 5s, ±50% jitter, reset after a connection
// that lived 10s). Every reconnect says hello again with the labels held now.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/smartroute/smartroute/worker-agent/agent"
)

func main() {
	cfg, err := agent.ConfigFromArgs(os.Args[1:], os.Getenv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker-agent:", err)
		os.Exit(2)
	}
	zerolog.TimeFieldFormat = time.RFC3339Nano
	if cfg.CPUProfile != "" {
		f, err := os.Create(cfg.CPUProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "worker-agent: --cpu-prof:", err)
			os.Exit(2)
		}
		defer f.Close()
		defer pprof.StopCPUProfile()
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	context.AfterFunc(ctx, stop) // after the first signal, a second one kills
	if err := agent.RunMany(ctx, cfg, cfg.Agents); err != nil {
		pprof.StopCPUProfile() // os.Exit skips the deferred stop
		fmt.Fprintln(os.Stderr, "worker-agent:", err)
		if errors.Is(err, agent.ErrConfig) { // refused before it started, as a bad flag
			os.Exit(2)
		}
		os.Exit(1)
	}
}
