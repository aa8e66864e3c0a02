// Command dispatcher runs smartroute's dispatcher: producers POST tasks to /run-task,
// workers hold WebSockets on /worker-listen, and the scheduler sends each task where it
// finishes soonest.
//
// Every flag has an environment variable: the flag name upper-cased with dashes as
// underscores (--random-dispatch → RANDOM_DISPATCH). A flag given on the command line
// wins over the environment.
package main

import (
	"context"
	"flag"
	"fmt"
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
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "dispatcher:", err)
		os.Exit(1)
	}
}

func run() error {
	fs := flag.NewFlagSet("dispatcher", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:8080", "listen address")
	random := fs.Bool("random-dispatch", false, "baseline: one common FIFO queue, any free worker")
	policy := fs.String("policy", string(scheduler.PolicyAffinity), "routing policy: affinity or random")
	cpuProf := fs.String("cpu-prof", "", "write a pprof CPU profile to this file on shutdown")
	pprofAddr := fs.String("pprof-addr", "", "serve net/http/pprof on this address (off when empty; keep it private)")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	taskTimeout := fs.Duration("task-timeout", 5*time.Minute, "deadline of a task that sets no timeout_ms")
	shutdownTimeout := fs.Duration("shutdown-timeout", 30*time.Second, "how long shutdown waits for in-flight tasks")
	uploaderURL := fs.String("uploader-url", "", "uploader service that POST /upload-model is forwarded to")
	maxQueued := fs.Int("max-queued", 100_000, "tasks waiting for a worker before /run-task answers 429")
	maxAttempts := fs.Int("max-attempts", 3, "starts of a task before it fails because its workers were lost")
	loadPrior := fs.Duration("load-time-prior", 400*time.Millisecond, "expected label load time before any is observed")
	runPrior := fs.Duration("run-time-prior", 50*time.Millisecond, "expected task run time before any is observed")
	passOver := fs.Duration("max-pass-over", 2*time.Second, "floor of how long a task may be passed over for other labels' backlogs")
	passOverLoads := fs.Float64("pass-over-loads", 100, "how long a task may be passed over, in load times of its label")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return err
	}
	if err := fromEnv(fs); err != nil {
		return err
	}
	level, err := zerolog.ParseLevel(*logLevel)
	if err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := zerolog.New(os.Stdout).Level(level).With().Timestamp().Logger()

	d, err := dispatcher.New(dispatcher.Config{
		Addr:           *addr,
		RandomDispatch: *random,
		Scheduler: scheduler.Config{Policy: scheduler.Policy(*policy), MaxAttempts: *maxAttempts,
			LoadTimePrior: *loadPrior, RunTimePrior: *runPrior, MaxPassOver: *passOver, PassOverLoads: *passOverLoads},
		TaskTimeout:     *taskTimeout,
		ShutdownTimeout: *shutdownTimeout,
		UploaderURL:     *uploaderURL,
		MaxQueued:       *maxQueued,
		Logger:          log,
	})
	if err != nil {
		return err
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
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	return d.Run(ctx, nil)
}

// fromEnv sets every flag not given on the command line from its environment variable.
func fromEnv(fs *flag.FlagSet) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		env := strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(env); ok && !given[f.Name] && err == nil {
			if e := f.Value.Set(v); e != nil {
				err = fmt.Errorf("%s=%q: %w", env, v, e)
			}
		}
	})
	return err
}
