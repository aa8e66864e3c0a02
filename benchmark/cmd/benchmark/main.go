// Command benchmark loads a smartroute dispatcher and reports how well it routes.
//
// Usage:
//
//	benchmark run [flags]
//
// run builds the dispatcher and the worker agent from the repository, starts a
// dispatcher and NUM_WORKERS agents (simulated backend) as processes on loopback,
// runs closed-loop producers against it, stops everything and prints the seed's
// summary (worker log summary, producer log summary) plus latency and throughput.
// With --compare it runs label routing, then random dispatch, with the same seed and
// prints the two side by side. A progress bar goes to stderr when stderr is a
// terminal, except with --json.
//
// The seed's 4-label comparison, time-scaled to about a minute per mode (the README's
// main job):
//
//	go run ./benchmark/cmd/benchmark run --compare --scenario seed-4
//
// which is the same as
//
//	go run ./benchmark/cmd/benchmark run --compare --requests 2400 --producers 2 \
//	    --labels 4 --wait-avg 0.75 --wait-stddev 1.0 --time-scale 0.05
//
// Flags of run (defaults in brackets):
//
//	--scenario NAME       preset: seed-4 or seed-5 (the seed's published runs at time
//	                      scales 0.05 and 0.02); flags given with it override it
//	--requests N          total requests, split across the producers [10]
//	--producers N         concurrent closed-loop producers [2]
//	--wait-avg S          mean pause after each request, seconds [1.0]
//	--wait-stddev S       standard deviation of the pause, seconds; the pause is
//	                      max(0.1 s, normal(avg, stddev)) [0.5]
//	--labels N            number of labels, label-1..label-N, chosen uniformly [4]
//	--task-types LIST     comma-separated task types, chosen uniformly [sample_task; infer with triton]
//	--parameters JSON     parameters_json of every task [the seed's; a small infer body with triton]
//	--backend NAME        agents' backend: sim, or triton (a fake Triton beside each agent) [sim; env BACKEND]
//	--sync-share F        share of synchronous requests; the rest are sent with
//	                      "return_result": false and polled [1.0]
//	--seed N              seed of the producers and (offset per worker) the agents [1]
//	--time-scale F        multiplies every duration: pauses and simulated load and
//	                      run times [1.0]
//	--request-timeout D   bound on one request, polling included; 0 for none [2m]
//	--num-workers N       worker agents; env NUM_WORKERS [2]
//	--max-labels N        labels each agent holds at once [2]
//	--slots N             tasks each agent runs at once [1]
//	--random-dispatch     random dispatch instead of routing; env RANDOM_DISPATCH [false]
//	--compare             run routing then random dispatch and compare them
//	--sim-load-time D     simulated label load time [400ms]
//	--sim-load-jitter D   simulated load time jitter [50ms]
//	--sim-run-time D      simulated run time [50ms]
//	--sim-run-jitter D    simulated run time jitter [10ms]
//	--task-timeout D      dispatcher --task-timeout; 0 keeps its default [0]
//	--log-level L         dispatcher log level [info]
//	--repo DIR            repository to build from [the directory holding go.work
//	                      at or above the working directory]
//	--bin-dir DIR         use the prebuilt dispatcher, worker-agent, log-collector (and fake-triton) in DIR
//	--out DIR             logs and records, one subdirectory per mode [a new
//	                      directory under the system's temporary directory]
//	--ready-timeout D     bound on the dispatcher and workers becoming ready [30s]
//	--stop-timeout D      grace after SIGTERM before SIGKILL [10s]
//	--json                print the result as JSON on stdout, nothing else
//	--chart FILE          write an SVG bar chart of the comparison (needs --compare)
//	--quiet               no log lines on stderr
//
// Durations (D) take Go's form: 400ms, 1.5s, 2m. Exit status: 0 on success, 1 when
// the run failed, no task completed in it or one of its processes exited before the
// stop (the summary is still printed), 2 on bad usage (refused before anything
// starts; a --bin-dir without the binaries or a --repo without go.work among them),
// 130 when interrupted. A second Ctrl-C ends the program at once, should the orderly
// stop after the first one hang.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"

	"github.com/smartroute/smartroute/benchmark/live"
)

func main() {
	ctx, stop := interruptContext(context.Background())
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// interruptContext is cancelled by the first SIGINT or SIGTERM, which stops the run in
// order: processes stopped, requests in flight ended. A second signal ends the program
// at once, should that stop hang, as the batch command does: the handler is let go
// before the context is cancelled, so no second signal can fall between the two and
// the next one meets the default action. (signal.NotifyContext keeps catching them:
// a second Ctrl-C did nothing.)
func interruptContext(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(parent)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		select {
		case <-sigs:
		case <-ctx.Done():
		}
		signal.Stop(sigs)
		cancel()
	}()
	return ctx, cancel
}

const usage = `usage: benchmark <command> [flags]

commands:
  run       start a dispatcher and workers, load them, print the summary
            (benchmark run -h lists the flags)
  simulate  replay a scenario through routing policies on a virtual clock
            (benchmark simulate -h lists the flags)
  batch-compare
            run a batch job with label-aware order and in file order on fresh
            simulated fleets; print label loads and wall time
            (benchmark batch-compare -h lists the flags)
  soak      run a real stack at 80% of its measured capacity for 5 minutes and
            check errors (0) and the dispatcher's memory (flat within 10%)
            (benchmark soak -h lists the flags)
`

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "run":
		cfg, err := parseRun(args[1:], getenv, stderr)
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		if err != nil {
			fmt.Fprintf(stderr, "benchmark run: %v\n", err)
			return 2
		}
		if err := live.Run(ctx, cfg, stdout); err != nil {
			if ctx.Err() != nil {
				fmt.Fprintf(stderr, "benchmark run: interrupted: %v\n", err)
				return 130
			}
			fmt.Fprintf(stderr, "benchmark run: %v\n", err)
			if errors.Is(err, live.ErrConfig) { // refused before anything started
				return 2
			}
			return 1
		}
		return 0
	case "simulate":
		return simulate(args[1:], stdout, stderr)
	case "batch-compare":
		return batchCompare(ctx, args[1:], stdout, stderr)
	case "soak":
		return soak(ctx, args[1:], stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "benchmark: unknown command %q\n%s", args[0], usage)
		return 2
	}
}

// parseRun turns the flags and environment of `benchmark run` into a live.Config.
func parseRun(args []string, getenv func(string) string, stderr io.Writer) (live.Config, error) {
	cfg := live.DefaultConfig()
	// Precedence: defaults, then a --scenario preset, then the environment, then flags;
	// so the scenario is read before anything else.
	if name := scenarioArg(args); name != "" {
		if err := live.ApplyScenario(&cfg, name); err != nil {
			return cfg, err
		}
	}
	if v := getenv("NUM_WORKERS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return cfg, fmt.Errorf("NUM_WORKERS=%q: not an integer", v)
		}
		cfg.NumWorkers = n
	}
	if v := getenv("BACKEND"); v != "" {
		cfg.Backend = v
	}
	if v := getenv("RANDOM_DISPATCH"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return cfg, fmt.Errorf("RANDOM_DISPATCH=%q: not a boolean", v)
		}
		cfg.RandomDispatch = b
	}

	fs := flag.NewFlagSet("benchmark run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.String("scenario", "", "preset workload: seed-4 or seed-5 (the seed's published runs, time-scaled)")
	fs.IntVar(&cfg.Requests, "requests", cfg.Requests, "total requests, split across the producers")
	fs.IntVar(&cfg.Producers, "producers", cfg.Producers, "concurrent closed-loop producers")
	waitAvg := fs.Float64("wait-avg", cfg.WaitAvg.Seconds(), "mean pause after each request, seconds")
	waitStddev := fs.Float64("wait-stddev", cfg.WaitStddev.Seconds(), "standard deviation of the pause, seconds")
	fs.IntVar(&cfg.Labels, "labels", cfg.Labels, "number of labels (label-1..label-N)")
	taskTypes := fs.String("task-types", "", "comma-separated task types (default sample_task; infer with --backend triton)")
	fs.StringVar(&cfg.Parameters, "parameters", "", "parameters_json of every task (default the seed's; a small infer body with --backend triton)")
	fs.StringVar(&cfg.Backend, "backend", cfg.Backend, "agents' backend: sim, or triton (a fake Triton beside each agent) (env BACKEND)")
	fs.Float64Var(&cfg.SyncShare, "sync-share", cfg.SyncShare, "share of synchronous requests")
	fs.Int64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the producers and agents")
	fs.Float64Var(&cfg.TimeScale, "time-scale", cfg.TimeScale, "multiplies every duration of the workload")
	fs.DurationVar(&cfg.RequestTimeout, "request-timeout", cfg.RequestTimeout, "bound on one request; 0 for none")
	addClusterFlags(fs, &cfg)
	// Only run reads NUM_WORKERS (soak and batch-compare do not), and only run has
	// --backend: their help must not promise either.
	fs.Lookup("num-workers").Usage += " (env NUM_WORKERS)"
	fs.Lookup("bin-dir").Usage += ", and fake-triton for --backend triton"
	fs.BoolVar(&cfg.RandomDispatch, "random-dispatch", cfg.RandomDispatch, "random dispatch instead of routing (env RANDOM_DISPATCH)")
	fs.BoolVar(&cfg.Compare, "compare", false, "run routing then random dispatch and compare")
	fs.BoolVar(&cfg.JSON, "json", false, "print the result as JSON on stdout")
	fs.StringVar(&cfg.ChartPath, "chart", "", "write an SVG chart of the comparison to this file (needs --compare)")
	quiet := fs.Bool("quiet", false, "no log lines on stderr")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if cfg.WaitAvg, err = seconds("--wait-avg", *waitAvg); err != nil {
		return cfg, err
	}
	if cfg.WaitStddev, err = seconds("--wait-stddev", *waitStddev); err != nil {
		return cfg, err
	}
	if *taskTypes != "" {
		cfg.TaskTypes = strings.Split(*taskTypes, ",")
	}

	terminal := isTerminal(stderr)
	if terminal && !cfg.JSON {
		cfg.Progress = stderr
	}
	if !*quiet {
		cfg.Logger = zerolog.New(zerolog.ConsoleWriter{Out: stderr, NoColor: !terminal, TimeFormat: time.TimeOnly}).
			With().Timestamp().Str("component", "benchmark").Logger()
	}
	return cfg, cfg.Validate()
}

// addClusterFlags registers the flags of the fleet a live run starts.
func addClusterFlags(fs *flag.FlagSet, cfg *live.Config) {
	fs.IntVar(&cfg.NumWorkers, "num-workers", cfg.NumWorkers, "worker agents")
	fs.IntVar(&cfg.MaxLabels, "max-labels", cfg.MaxLabels, "labels each agent holds at once")
	fs.IntVar(&cfg.Slots, "slots", cfg.Slots, "tasks each agent runs at once")
	fs.DurationVar(&cfg.SimLoadTime, "sim-load-time", cfg.SimLoadTime, "simulated label load time")
	fs.DurationVar(&cfg.SimLoadJitter, "sim-load-jitter", cfg.SimLoadJitter, "simulated load time jitter")
	fs.DurationVar(&cfg.SimRunTime, "sim-run-time", cfg.SimRunTime, "simulated run time")
	fs.DurationVar(&cfg.SimRunJitter, "sim-run-jitter", cfg.SimRunJitter, "simulated run time jitter")
	fs.DurationVar(&cfg.TaskTimeout, "task-timeout", cfg.TaskTimeout, "dispatcher --task-timeout; 0 keeps its default")
	fs.StringVar(&cfg.LogLevel, "log-level", cfg.LogLevel, "dispatcher log level")
	fs.StringVar(&cfg.RepoDir, "repo", "", "repository to build from (default: go.work at or above the working directory)")
	fs.StringVar(&cfg.BinDir, "bin-dir", "", "use prebuilt binaries from this directory: dispatcher, worker-agent and log-collector")
	fs.StringVar(&cfg.OutDir, "out", "", "directory for logs and records; the subdirectory each run writes (routing/ and random/, soak/, batch-<order>/) is replaced (default: a new temporary directory)")
	fs.DurationVar(&cfg.ReadyTimeout, "ready-timeout", cfg.ReadyTimeout, "bound on the dispatcher and workers becoming ready")
	fs.DurationVar(&cfg.StopTimeout, "stop-timeout", cfg.StopTimeout, "grace after SIGTERM before SIGKILL")
}

// scenarioArg finds --scenario's value among the arguments (before flag parsing); as
// with any flag, the last one given wins.
func scenarioArg(args []string) string {
	last := ""
	for i, a := range args {
		if a == "--" {
			break
		}
		name := strings.TrimLeft(a, "-")
		if len(a)-len(name) < 1 || len(a)-len(name) > 2 {
			continue
		}
		if v, ok := strings.CutPrefix(name, "scenario="); ok {
			last = v
		}
		if name == "scenario" && i+1 < len(args) {
			last = args[i+1]
		}
	}
	return last
}

// seconds converts a flag's seconds to a Duration. NaN, the infinities and more seconds
// than a Duration holds are refused: converted, they wrap around to nonsense.
func seconds(flag string, v float64) (time.Duration, error) {
	ns := v * float64(time.Second)
	if math.IsNaN(ns) || math.Abs(ns) >= math.MaxInt64 {
		return 0, fmt.Errorf("%s must be a number of seconds a duration can hold (at most %d), got %v",
			flag, math.MaxInt64/int64(time.Second), v)
	}
	return time.Duration(ns), nil
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && (isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd()))
}
