// Command dispatcher runs smartroute's dispatcher: producers POST tasks to /run-task,
// workers hold WebSockets on /worker-listen, and the scheduler sends each task where it
// finishes soonest.
//
// Every flag has an environment variable: the flag name upper-cased with dashes as
// underscores (--random-dispatch → RANDOM_DISPATCH). A flag given on the command line
// wins over the environment; an empty variable counts as unset.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"net"
	"net/http"
	_ "net/http/pprof"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/smartroute/smartroute/dispatcher"
	"github.com/smartroute/smartroute/dispatcher/scheduler"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0) // the usage is printed; asking for it is not a failure
		}
		fmt.Fprintln(os.Stderr, "dispatcher:", err)
		os.Exit(exitCode(err))
	}
}

// usageError is a command line or environment the dispatcher cannot start with. It
// exits 2, as the worker agent and the batch job do and as Go's flag package does, so
// that a supervisor or script can tell a bad configuration from a failure at run time
// (exit 1).
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

func exitCode(err error) int {
	var ue usageError
	if errors.As(err, &ue) || errors.Is(err, dispatcher.ErrConfig) {
		return 2
	}
	return 1
}

func run(args []string) error {
	fs := flag.NewFlagSet("dispatcher", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:8080", "listen address")
	random := fs.Bool("random-dispatch", false, "baseline: one common FIFO queue, any free worker")
	policy := fs.String("policy", string(scheduler.PolicyAffinity), "routing policy: affinity or random")
	cpuProf := fs.String("cpu-prof", "", "write a pprof CPU profile to this file on shutdown")
	pprofAddr := fs.String("pprof-addr", "", "serve net/http/pprof on this address, without auth (off when empty; --ops-auth does not cover it: keep it private)")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	taskTimeout := fs.Duration("task-timeout", 5*time.Minute, "deadline of a task that sets no timeout_ms")
	shutdownTimeout := fs.Duration("shutdown-timeout", 30*time.Second, "how long shutdown waits for in-flight tasks")
	uploaderURL := fs.String("uploader-url", "", "uploader service that POST /upload-model is forwarded to")
	maxQueued := fs.Int("max-queued", 100_000, "tasks waiting for a worker before /run-task answers 429")
	maxAttempts := fs.Int("max-attempts", 3, "starts of a task before it fails because its workers were lost")
	// The scheduler's own defaults, so that the dispatcher and the simulator (which
	// leaves these zero unless a scenario sets them) start from the same estimates.
	schedDefaults := scheduler.Config{}.WithDefaults()
	loadPrior := fs.Duration("load-time-prior", schedDefaults.LoadTimePrior, "expected label load time before any is observed")
	runPrior := fs.Duration("run-time-prior", schedDefaults.RunTimePrior, "expected task run time before any is observed")
	passOver := fs.Duration("max-pass-over", schedDefaults.MaxPassOver, "floor of how long a task may be passed over for other labels' backlogs")
	metricsMaxLabels := fs.Int("metrics-max-labels", 500, "labels with series of their own in /metrics; the rest count as label=\"other\"")
	passOverLoads := fs.Float64("pass-over-loads", schedDefaults.PassOverLoads, "how long a task may be passed over, in load times of its label")
	maxDelaySlack := fs.Duration("max-delay-slack", schedDefaults.MaxDelaySlack, "most a result's delay outside its task (network, a busy host) lets a holder overrun its estimate before it counts as stuck")
	maxBody := fs.Int64("max-body-bytes", 1<<20, "largest /run-task or /upload-model body; larger gets 413")
	bodyReadTimeout := fs.Duration("body-read-timeout", 30*time.Second, "how long a request, its body included, may take to arrive; a body that stalls gets 408 (not the wait for a task's answer)")
	idleTimeout := fs.Duration("idle-timeout", 2*time.Minute, "how long a kept-alive HTTP connection may wait for its next request before it is closed")
	maxParams := fs.Int("max-params-bytes", 1<<20, "largest decoded parameters_json; larger gets 413")
	maxQueuedPerLabel := fs.Int("max-queued-per-label", 0, "tasks waiting for one label before /run-task answers 429 (0: --max-queued)")
	sendQueue := fs.Int("send-queue-frames", 1024, "frames queued for one worker before it is cut off as too slow")
	maxFrame := fs.Int64("max-frame-bytes", 16<<20, "largest frame read from a worker; larger closes the connection")
	workerTokens := fs.String("worker-token", "", "comma-separated bearer tokens accepted from workers on /worker-listen (prefer the env var: flags show in ps)")
	workerTokensFile := fs.String("worker-tokens-file", "", "file of worker tokens, one per line, # comments; \"<token> worker-id=<id>...\" binds a token to those ids (id* a prefix); re-read on SIGHUP")
	apiKeys := fs.String("api-key", "", "comma-separated API keys accepted from producers (prefer the env var: flags show in ps)")
	apiKeysFile := fs.String("api-keys-file", "", "file of API keys, one per line, # comments; re-read on SIGHUP")
	opsAuth := fs.Bool("ops-auth", false, "the ops endpoints (/workers, /labels, /metrics) need an API key too; --pprof-addr is not covered")
	tlsCert := fs.String("tls-cert", "", "PEM certificate: serve HTTPS and wss:// (with --tls-key)")
	tlsKey := fs.String("tls-key", "", "PEM private key of --tls-cert")
	insecure := fs.Bool("insecure-no-auth", false, "allow a non-loopback --addr without both worker tokens and API keys")
	failThreshold := fs.Int("label-failure-threshold", 3, "load failures of a label within --label-failure-window that mark it failing")
	failWindow := fs.Duration("label-failure-window", time.Minute, "window in which load failures of a label are counted")
	failCooldown := fs.Duration("label-failure-cooldown", 30*time.Second, "how long a failing label's tasks fail at once (503) before a load is tried again")
	fleetSettle := fs.Duration("fleet-settle", 30*time.Second, "how long after a worker connects, leaves or changes what it can load a task for a label no worker can load waits, rather than fail with 503")
	dataDir := fs.String("data-dir", "./data", "directory of the journal of asynchronous tasks (--data-dir= on the command line: no journal, a crash loses them)")
	lockTimeout := fs.Duration("journal-lock-timeout", time.Second, "how long to wait for another dispatcher to release the journal in --data-dir (a pod being replaced) before failing")
	retention := fs.Duration("task-retention", 10*time.Minute, "how long a finished task answers GET /tasks/{id} and resubmissions of its id")
	retentionCount := fs.Int("task-retention-count", 100_000, "most finished tasks kept in memory for --task-retention (journaled ones are also answered from the journal)")
	retentionBytes := fs.Int64("task-retention-bytes", 256<<20, "most memory the finished tasks kept hold, their results included; the oldest go first")
	// 0 stands for "not given", so that the help does not print one of the two defaults
	// as the only one.
	gcTarget := fs.Int("gc-percent", 0, "garbage-collector target as in GOGC (-1: off); by default 800 when a memory limit is in effect (the container's or GOMEMLIMIT), else 200; GOGC in the environment wins over the default")
	memRatio := fs.Float64("memory-limit-ratio", 0.9, "share of the container's memory limit (cgroup) set as the Go runtime's soft limit (0: none); GOMEMLIMIT in the environment wins")
	fs.VisitAll(func(f *flag.Flag) { f.Usage += " (env " + envName(f.Name) + ")" })
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if fs.NArg() > 0 { // a flag written without its dashes, say: never ignore it
		return usageError{fmt.Errorf("unexpected arguments: %q", fs.Args())}
	}
	gcGiven := os.Getenv(envName("gc-percent")) != "" || given(fs, "gc-percent")
	if err := fromEnv(fs); err != nil {
		return usageError{err}
	}
	if err := refuseZero(fs); err != nil {
		return usageError{err}
	}
	// NaN, Inf and 1e30 parse as floats; the scheduler would refuse them too, without
	// the flag's name.
	if err := scheduler.CheckPassOverLoads(*passOverLoads, *loadPrior); err != nil {
		return usageError{fmt.Errorf("--pass-over-loads (PASS_OVER_LOADS) %w", err)}
	}
	routing, err := resolvePolicy(fs, *random, *policy)
	if err != nil {
		return usageError{err}
	}
	level, err := zerolog.ParseLevel(*logLevel)
	if err == nil && level == zerolog.NoLevel { // "": every record filtered out, silently
		err = errors.New("empty; want trace, debug, info, warn, error, fatal, panic or disabled")
	}
	if err != nil {
		return usageError{fmt.Errorf("--log-level: %w", err)}
	}
	log := zerolog.New(os.Stdout).Level(level).With().Timestamp().Logger()
	// SIGHUP re-reads the token and key files. Caught from here on: New replays the
	// journal, which can take a while, and SIGHUP's default action would end the
	// process; one that comes meanwhile is handled once New is done.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	// SIGTERM too: a pod stopped while New waits for the journal's lock (up to a minute
	// in the chart) or replays it exits 0 at once, as after any shutdown, rather than
	// dying of the signal (143). Nothing has been accepted yet, and the journal is a
	// bbolt file, whose transactions survive the process ending anywhere.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	gc, err := setupGC(*gcTarget, gcGiven, *memRatio)
	if err != nil {
		return usageError{err}
	}
	if gc.memLimitErr != nil {
		log.Warn().Err(gc.memLimitErr).Msg("could not read the container's memory limit; running without a Go memory limit")
	}
	if gc.containerLimit != 0 {
		log.Warn().Int64("memory_limit_bytes", gc.memLimit).Int64("container_memory_limit_bytes", gc.containerLimit).
			Msg("GOMEMLIMIT is above the container's memory limit: the heap may outgrow the container and be OOM-killed; set GOMEMLIMIT below it, or leave it unset to use --memory-limit-ratio")
	}
	ev := log.Info().Int("gc_percent", gc.percent).Str("gc_percent_from", gc.source)
	if gc.memLimit != math.MaxInt64 {
		ev = ev.Int64("memory_limit_bytes", gc.memLimit)
	}
	ev.Msg("garbage collector")

	type started struct {
		d   *dispatcher.Dispatcher
		err error
	}
	starting := make(chan started, 1)
	cfg := dispatcher.Config{
		Addr: *addr,
		Scheduler: scheduler.Config{Policy: routing, MaxAttempts: *maxAttempts,
			LoadTimePrior: *loadPrior, RunTimePrior: *runPrior, MaxPassOver: *passOver, PassOverLoads: *passOverLoads,
			LabelFailureThreshold: *failThreshold, LabelFailureWindow: *failWindow, LabelFailureCooldown: *failCooldown,
			FleetSettle: *fleetSettle, MaxDelaySlack: *maxDelaySlack},
		TaskTimeout:        *taskTimeout,
		ShutdownTimeout:    *shutdownTimeout,
		UploaderURL:        *uploaderURL,
		MaxQueued:          *maxQueued,
		MaxQueuedPerLabel:  *maxQueuedPerLabel,
		MaxBodyBytes:       *maxBody,
		BodyReadTimeout:    *bodyReadTimeout,
		IdleTimeout:        *idleTimeout,
		MaxParamsBytes:     *maxParams,
		SendQueueFrames:    *sendQueue,
		MaxFrameBytes:      *maxFrame,
		WorkerTokens:       splitList(*workerTokens),
		WorkerTokensFile:   *workerTokensFile,
		APIKeys:            splitList(*apiKeys),
		APIKeysFile:        *apiKeysFile,
		OpsAuth:            *opsAuth,
		TLSCert:            *tlsCert,
		TLSKey:             *tlsKey,
		InsecureNoAuth:     *insecure,
		MetricsMaxLabels:   *metricsMaxLabels,
		DataDir:            *dataDir,
		TaskRetention:      *retention,
		JournalLockTimeout: *lockTimeout,
		TaskRetentionCount: *retentionCount,
		TaskRetentionBytes: *retentionBytes,
		Logger:             log,
	}
	go func() {
		d, err := dispatcher.New(cfg)
		starting <- started{d, err}
	}()
	var d *dispatcher.Dispatcher
	select {
	case s := <-starting:
		if s.err != nil {
			return s.err
		}
		d = s.d
	case <-ctx.Done():
		log.Info().Msg("stopped while starting")
		return nil
	}
	if *cpuProf != "" {
		f, err := os.Create(*cpuProf)
		if err != nil {
			return fmt.Errorf("--cpu-prof: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("--cpu-prof: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	if *pprofAddr != "" {
		// A separate listener, so profiling is never exposed on the task API's address.
		ln, err := net.Listen("tcp", *pprofAddr)
		if err != nil {
			return fmt.Errorf("--pprof-addr: %w", err)
		}
		defer ln.Close()
		go http.Serve(ln, http.DefaultServeMux) // net/http/pprof registers on the default mux
		log.Info().Str("addr", ln.Addr().String()).Msg("pprof listening")
	}
	// A reload error keeps the previous secrets (and is logged by ReloadCredentials).
	go func() {
		for {
			select {
			case <-hup:
				_ = d.ReloadCredentials()
			case <-ctx.Done():
				return
			}
		}
	}()
	return d.Run(ctx, nil)
}

// zeroMeansDefault are the flags whose zero dispatcher.Config reads as "the default".
// Someone who writes 0 (no cool-down, no retention) means something else; running
// with 30s or 10m instead would be a silent surprise.
var zeroMeansDefault = []string{
	"task-timeout", "shutdown-timeout", "max-queued", "max-attempts", "load-time-prior", "run-time-prior",
	"max-pass-over", "pass-over-loads", "max-delay-slack", "metrics-max-labels", "max-body-bytes", "max-params-bytes",
	"send-queue-frames", "max-frame-bytes", "label-failure-threshold", "label-failure-window",
	"label-failure-cooldown", "fleet-settle", "task-retention", "task-retention-count", "task-retention-bytes", "journal-lock-timeout",
	"body-read-timeout", "idle-timeout",
}

// refuseZero refuses 0 for the flags in zeroMeansDefault, from the command line or
// the environment.
func refuseZero(fs *flag.FlagSet) error {
	for _, name := range zeroMeansDefault {
		f := fs.Lookup(name)
		if f == nil {
			panic("refuseZero: no flag --" + name)
		}
		if v := f.Value.String(); v == "0" || v == "0s" {
			return fmt.Errorf("--%s (%s) must be more than 0; leave it out for the default, %s", name, envName(name), f.DefValue)
		}
	}
	return nil
}

// splitList splits a comma-separated flag value, dropping empty items.
func splitList(s string) []string {
	var out []string
	for v := range strings.SplitSeq(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}

// resolvePolicy reconciles --random-dispatch, the seed's switch, with --policy. Either may
// come from the command line or the environment: the command line wins, as for every
// flag, and the two set at the same level to different policies are refused rather than
// one silently overriding the other (RANDOM_DISPATCH=true in an env file once replaced
// the chart's POLICY).
func resolvePolicy(fs *flag.FlagSet, random bool, policy string) (scheduler.Policy, error) {
	if !random || scheduler.Policy(policy) == scheduler.PolicyRandom {
		return scheduler.Policy(policy), nil
	}
	level := func(name string) int { // 2: command line, 1: environment, 0: default
		switch {
		case given(fs, name):
			return 2
		case os.Getenv(envName(name)) != "":
			return 1
		}
		return 0
	}
	switch r, p := level("random-dispatch"), level("policy"); {
	case p > r:
		return scheduler.Policy(policy), nil
	case p == r:
		return "", fmt.Errorf("--random-dispatch (RANDOM_DISPATCH) and --policy %s (POLICY) disagree: give one of them", policy)
	}
	return scheduler.PolicyRandom, nil
}

// given reports whether the flag was set on the command line.
func given(fs *flag.FlagSet, name string) bool {
	found := false
	fs.Visit(func(f *flag.Flag) { found = found || f.Name == name })
	return found
}

func envName(flagName string) string {
	return strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// fromEnv sets every flag not given on the command line from its environment variable.
// An empty variable counts as unset, as in the other commands: a blank line in an env
// file must not fail the start (MAX_QUEUED=) or turn the journal off (DATA_DIR=).
func fromEnv(fs *flag.FlagSet) error {
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		env := envName(f.Name)
		if v := os.Getenv(env); v != "" && !given(fs, f.Name) && err == nil {
			if e := f.Value.Set(v); e != nil {
				err = fmt.Errorf("%s=%q: %w", env, v, e)
			}
		}
	})
	return err
}
