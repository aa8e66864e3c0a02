// Command log-collector receives the log streams of smartroute worker agents on
// /ingest and stores them as JSON lines per worker, with size-based rotation; GET /logs
// queries them and GET /health answers {"message":"OK"}.
//
// Flags (each also read from the environment variable in brackets; a flag given on the
// command line wins over the variable, which wins over the default):
//
//	--addr                 [ADDR]                 127.0.0.1:8090: listen address
//	--dir                  [DIR]                  ./logs: a directory per worker
//	--max-file-bytes       [MAX_FILE_BYTES]       67108864 (64 MiB): rotate a worker's file before it would pass this
//	--max-files            [MAX_FILES]            10: files kept per worker, the current one included
//	--max-active-queries   [MAX_ACTIVE_QUERIES]   2: GET /logs queries at once, each holding up to 64 MiB of records; more get 503
//	--query-write-timeout  [QUERY_WRITE_TIMEOUT]  1m: time a client has to read a GET /logs answer before it is cut off
//	--shutdown-timeout     [SHUTDOWN_TIMEOUT]     10s: how long SIGTERM waits for batches being written
//	--log-level            [LOG_LEVEL]            info: the collector's own log (JSON on stdout)
//	--ingest-token         [INGEST_TOKEN]         none: comma-separated bearer tokens accepted on /ingest (the agents' worker tokens)
//	--tls-cert             [TLS_CERT]             none: PEM certificate; with --tls-key, serve HTTPS and wss://
//	--tls-key              [TLS_KEY]              none: PEM private key of --tls-cert
//	--pprof-addr           [PPROF_ADDR]           none: serve net/http/pprof on this address (keep it private)
//	--memory-limit-ratio   [MEMORY_LIMIT_RATIO]   0.9: share of the container's memory limit set as the Go runtime's soft limit (0: none; GOMEMLIMIT wins)
//
// GET /metrics on --addr serves Prometheus metrics (README, "Metrics").
//
// SIGTERM or SIGINT: the listener closes, every stream is closed with SHUTDOWN (4000),
// batches being written finish, and the process exits 0. Agents resend what was not
// acknowledged to the next collector.
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
	"strings"
	"syscall"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/rs/zerolog"

	logcollector "github.com/smartroute/smartroute/log-collector"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "log-collector:", err)
		os.Exit(exitCode(err))
	}
}

// usageError is a command line or environment the collector cannot start with. It
// exits 2, as the other commands and Go's flag package do, so that a supervisor or
// script can tell a bad configuration from a failure at run time (exit 1).
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

func exitCode(err error) int {
	var ue usageError
	if errors.As(err, &ue) || errors.Is(err, logcollector.ErrConfig) {
		return 2
	}
	return 1
}

func run(args []string) error {
	var cfg logcollector.Config
	fs := flag.NewFlagSet("log-collector", flag.ContinueOnError)
	fs.StringVar(&cfg.Addr, "addr", logcollector.DefaultAddr, "listen address")
	fs.StringVar(&cfg.Dir, "dir", logcollector.DefaultDir, "directory holding a directory per worker")
	fs.Int64Var(&cfg.MaxFileBytes, "max-file-bytes", logcollector.DefaultMaxFileBytes, "rotate a worker's file before a batch would take it past this size")
	fs.IntVar(&cfg.MaxFiles, "max-files", logcollector.DefaultMaxFiles, "files kept per worker, the current one included")
	fs.Int64Var(&cfg.MaxTotalBytes, "max-total-bytes", 0, "bound on all workers' files together: past it the oldest files go first, whichever worker's; a current file only with its worker gone an hour (0: none)")
	fs.IntVar(&cfg.MaxActiveBatches, "max-active-batches", logcollector.DefaultMaxActiveBatches, "batches read and written at once across all streams, each holding about twice its size in memory; more wait their turn")
	fs.IntVar(&cfg.MaxActiveQueries, "max-active-queries", logcollector.DefaultMaxActiveQueries, "GET /logs queries run at once, each holding up to 64 MiB of records until its answer is written; more get 503 with Retry-After")
	fs.DurationVar(&cfg.QueryWriteTimeout, "query-write-timeout", logcollector.DefaultQueryWriteTimeout, "time a client has to read a GET /logs answer, from the end of its scan, before it is cut off")
	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", logcollector.DefaultShutdownTimeout, "how long shutdown waits for batches being written")
	fs.StringVar(&cfg.TLSCert, "tls-cert", "", "PEM certificate: serve HTTPS and wss:// (with --tls-key)")
	fs.StringVar(&cfg.TLSKey, "tls-key", "", "PEM private key of --tls-cert")
	ingestTokens := fs.String("ingest-token", "", "comma-separated bearer tokens accepted on /ingest (prefer the env var: flags show in ps)")
	logLevel := fs.String("log-level", "info", "log level of the collector's own log: debug, info, warn, error")
	pprofAddr := fs.String("pprof-addr", "", "serve net/http/pprof on this address (off when empty; keep it private)")
	memRatio := fs.Float64("memory-limit-ratio", 0.9, "share of the container's memory limit (cgroup) set as the Go runtime's soft limit (0: none); GOMEMLIMIT in the environment wins")
	fs.VisitAll(func(f *flag.Flag) { f.Usage += " (env " + envName(f.Name) + ")" })
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected arguments: %q", fs.Args())}
	}
	inEnv, err := fromEnv(fs)
	if err != nil {
		return usageError{err}
	}
	// In Config zero means the default; on the command line it is a mistake.
	if cfg.MaxFiles < 1 || cfg.MaxFileBytes < 1 || cfg.MaxActiveBatches < 1 || cfg.MaxActiveQueries < 1 {
		return usageError{fmt.Errorf("--max-files (%d), --max-file-bytes (%d), --max-active-batches (%d) and --max-active-queries (%d) must be at least 1",
			cfg.MaxFiles, cfg.MaxFileBytes, cfg.MaxActiveBatches, cfg.MaxActiveQueries)}
	}
	if cfg.QueryWriteTimeout <= 0 {
		return usageError{fmt.Errorf("--query-write-timeout (QUERY_WRITE_TIMEOUT) must be more than 0; leave it out for the default, %s", logcollector.DefaultQueryWriteTimeout)}
	}
	if cfg.ShutdownTimeout == 0 {
		return usageError{fmt.Errorf("--shutdown-timeout (SHUTDOWN_TIMEOUT) must be more than 0; leave it out for the default, %s", logcollector.DefaultShutdownTimeout)}
	}
	for t := range strings.SplitSeq(*ingestTokens, ",") {
		if t = strings.TrimSpace(t); t != "" {
			cfg.IngestTokens = append(cfg.IngestTokens, t)
		}
	}
	// No tokens means no credentials asked: a list that was given and holds none (an
	// unset variable in a template, or INGEST_TOKEN from an empty key of a Secret)
	// must not open /ingest to anyone.
	given := inEnv["ingest-token"]
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == "ingest-token" })
	if given && len(cfg.IngestTokens) == 0 {
		return usageError{fmt.Errorf("--ingest-token (INGEST_TOKEN) %q holds no token; leave it unset to take streams without credentials", *ingestTokens)}
	}
	if math.IsNaN(*memRatio) || *memRatio < 0 || *memRatio > 1 {
		return usageError{fmt.Errorf("--memory-limit-ratio (MEMORY_LIMIT_RATIO) %v: want a share of the container's memory limit in (0, 1], or 0 for none", *memRatio)}
	}
	level, err := zerolog.ParseLevel(*logLevel)
	if err == nil && level == zerolog.NoLevel { // "": every record filtered out, silently
		err = errors.New("empty; want trace, debug, info, warn, error, fatal, panic or disabled")
	}
	if err != nil {
		return usageError{fmt.Errorf("--log-level: %w", err)}
	}
	zerolog.TimeFieldFormat = time.RFC3339Nano
	cfg.Logger = zerolog.New(os.Stdout).Level(level).With().Timestamp().Logger()
	setMemoryLimit(*memRatio, cfg.Logger)
	c, err := logcollector.New(cfg)
	if err != nil {
		return err
	}
	if *pprofAddr != "" {
		// A separate listener, so profiling is never exposed on the ingest address.
		ln, err := net.Listen("tcp", *pprofAddr)
		if err != nil {
			return fmt.Errorf("--pprof-addr: %w", err)
		}
		defer ln.Close()
		go http.Serve(ln, http.DefaultServeMux) // net/http/pprof registers on the default mux
		cfg.Logger.Info().Str("addr", ln.Addr().String()).Msg("pprof listening")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	return c.Run(ctx, nil)
}

// setMemoryLimit sets the runtime's soft memory limit to ratio of the container's
// (cgroup v1 or v2): two maximal GET /logs queries and a herd of backlogs come near a
// 256Mi container's limit (README, "Log collector"), and near the soft limit the
// garbage collector runs as often as it must instead of the kernel's OOM killer ending
// the process. No container limit, or a ratio of 0, leaves it unset; a limit that
// cannot be read is logged, and the collector runs on without one.
func setMemoryLimit(ratio float64, log zerolog.Logger) {
	if ratio == 0 {
		return
	}
	limit, err := memlimit.Set(memlimit.WithRatio(ratio), memlimit.WithProvider(memlimit.FromCgroup))
	switch {
	case err == nil:
		if limit != math.MaxInt64 {
			log.Info().Int64("memory_limit_bytes", limit).Float64("ratio", ratio).Msg("soft memory limit set")
		}
	case errors.Is(err, memlimit.ErrNoCgroup), errors.Is(err, memlimit.ErrCgroupsNotSupported):
	default:
		log.Warn().Err(err).Msg("the container's memory limit could not be read; running without a soft memory limit")
	}
}

func envName(flagName string) string {
	return strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// fromEnv sets every flag not given on the command line from its environment variable
// and returns the flags whose variable is set, empty or not. An empty variable leaves
// its flag alone (a blank line in an env file is no value), but it was given: an
// empty INGEST_TOKEN is refused as --ingest-token= is.
func fromEnv(fs *flag.FlagSet) (inEnv map[string]bool, err error) {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	inEnv = map[string]bool{}
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		name := envName(f.Name)
		v, ok := os.LookupEnv(name)
		if !ok || given[f.Name] {
			return
		}
		inEnv[f.Name] = true
		if v == "" {
			return
		}
		if err := f.Value.Set(v); err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: %w", name, v, err))
		}
	})
	return inEnv, errors.Join(errs...)
}
