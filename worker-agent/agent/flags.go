package agent

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/smartroute/smartroute/worker-agent/backend/triton"
)

// Command-line defaults of the simulated backend (the Config zero values mean instant).
const (
	DefaultSimLoadTime = 400 * time.Millisecond
	DefaultSimRunTime  = 40 * time.Millisecond
	DefaultSimSeed     = 1
)

// ConfigFromArgs turns command-line arguments and environment variables into a Config.
// Every flag --some-name has an environment variable SOME_NAME; a flag given on the
// command line wins over the variable, which wins over the default. getenv is usually
// os.Getenv; usage text goes to output. It returns flag.ErrHelp for -h/--help.
func ConfigFromArgs(args []string, getenv func(string) string, output io.Writer) (Config, error) {
	var (
		c      Config
		labels string
	)
	fs := flag.NewFlagSet("worker-agent", flag.ContinueOnError)
	fs.SetOutput(output)
	fs.StringVar(&c.DispatcherURL, "dispatcher-url", DefaultDispatcherURL, "dispatcher worker WebSocket URL")
	fs.StringVar(&c.WorkerToken, "worker-token", "", "bearer token sent to the dispatcher (prefer the env var: flags show in ps)")
	fs.StringVar(&c.CAFile, "ca-file", "", "PEM CA bundle trusted for wss:// dispatcher and log collector URLs (default: system roots)")
	fs.StringVar(&c.WorkerID, "worker-id", "", "worker id (default: host name plus a short random suffix)")
	fs.IntVar(&c.MaxLabels, "max-labels", DefaultMaxLabels, "labels held at once")
	fs.IntVar(&c.Slots, "slots", DefaultSlots, "tasks run at once")
	fs.StringVar(&labels, "labels", "", "comma-separated labels this worker may load (default: any)")
	fs.StringVar(&c.BackendName, "backend", DefaultBackendName, "inference backend: sim or triton")
	fs.DurationVar(&c.Sim.LoadTime, "sim-load-time", DefaultSimLoadTime, "sim backend: time to load a label")
	fs.DurationVar(&c.Sim.LoadJitter, "sim-load-jitter", 0, "sim backend: largest ± deviation of a load time (0: none)")
	fs.DurationVar(&c.Sim.RunTime, "sim-run-time", DefaultSimRunTime, "sim backend: time to run a task")
	fs.DurationVar(&c.Sim.RunJitter, "sim-run-jitter", 0, "sim backend: largest ± deviation of a run time (0: none)")
	fs.Int64Var(&c.Sim.Seed, "seed", DefaultSimSeed, "sim backend: seed of the jitter (same seed, same durations)")
	fs.StringVar(&c.Triton.URL, "triton-url", triton.DefaultURL, "triton backend: Triton's HTTP endpoint")
	fs.DurationVar(&c.Triton.LoadTimeout, "triton-load-timeout", triton.DefaultLoadTimeout, "triton backend: bound of one model load")
	fs.DurationVar(&c.Triton.UnloadTimeout, "triton-unload-timeout", triton.DefaultUnloadTimeout, "triton backend: bound of one unload, until the model has left UNLOADING")
	fs.DurationVar(&c.Triton.StartTimeout, "triton-start-timeout", triton.DefaultStartTimeout, "triton backend: how long to wait at start for Triton to be live and no model LOADING")
	fs.StringVar(&c.Triton.TextInput, "triton-text-input", triton.DefaultTextInput, "triton backend: BYTES input that embed_texts fills")
	fs.StringVar(&c.Triton.EmbeddingOutput, "triton-embedding-output", triton.DefaultEmbeddingOutput, "triton backend: FP32 output embed_texts returns")
	fs.DurationVar(&c.InventoryInterval, "inventory-interval", DefaultInventoryInterval, "triton backend: how often to read the repository index for models added or removed")
	fs.StringVar(&c.LogLevel, "log-level", DefaultLogLevel, "log level: debug, info, warn, error")
	fs.StringVar(&c.LogCollectorURL, "log-collector-url", "", "also stream log records to this log collector, e.g. ws://127.0.0.1:8090/ingest (default: off)")
	fs.DurationVar(&c.DrainTimeout, "drain-timeout", DefaultDrainTimeout, "how long a drain (SIGTERM, or the dispatcher's) waits for in-flight tasks before cancelling them")
	fs.StringVar(&c.CPUProfile, "cpu-prof", "", "write a pprof CPU profile to this file on exit")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", "", "serve /metrics, /healthz and /readyz on this address, e.g. :9100 (default: off)")
	fs.BoolVar(&c.Pprof, "pprof", false, "also serve /debug/pprof/ on --metrics-addr (keep that address private)")
	fs.IntVar(&c.Agents, "agents", 1, "agents to run in this process, named <worker-id>-1..N (load and scale tests)")
	fs.VisitAll(func(f *flag.Flag) { f.Usage += " (env " + envName(f.Name) + ")" })

	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	onCommandLine := make(map[string]bool)
	fs.Visit(func(f *flag.Flag) { onCommandLine[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		name := envName(f.Name)
		v := getenv(name)
		if onCommandLine[f.Name] || v == "" {
			return
		}
		if err := f.Value.Set(v); err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: %w", name, v, err))
		}
	})
	if err := errors.Join(errs...); err != nil {
		return Config{}, err
	}
	// In Config these zeros mean the default; written on the command line or in the
	// environment they mean something else (no wait, no slot), and running with the
	// default instead would be a silent surprise.
	for _, name := range zeroMeansDefault {
		f := fs.Lookup(name)
		if v := f.Value.String(); v == "0" || v == "0s" {
			errs = append(errs, fmt.Errorf("--%s (%s) must be more than 0; leave it out for the default, %s", name, envName(name), f.DefValue))
		}
	}
	if c.Agents < 1 {
		errs = append(errs, fmt.Errorf("--agents (AGENTS) must be at least 1, got %d", c.Agents))
	}
	if err := errors.Join(errs...); err != nil {
		return Config{}, err
	}
	c.Labels = splitLabels(labels)
	return c, nil
}

// zeroMeansDefault are the flags whose zero Config (or triton.Config) reads as the
// default. The sim durations are not among them: zero is instant there.
var zeroMeansDefault = []string{
	"max-labels", "slots", "drain-timeout", "inventory-interval",
	"triton-load-timeout", "triton-unload-timeout", "triton-start-timeout",
}

func envName(flagName string) string {
	return strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

func splitLabels(s string) []string {
	var out []string
	for l := range strings.SplitSeq(s, ",") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}
