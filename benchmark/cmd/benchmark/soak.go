package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/rs/zerolog"

	"github.com/smartroute/smartroute/benchmark/live"
)

// soak runs `benchmark soak`: exit 0 when the run had no error and the dispatcher's
// memory stayed flat, 1 when a target was missed or the run failed, 2 on bad usage.
func soak(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg := live.SoakConfig{Config: live.DefaultConfig()}
	cfg.NumWorkers, cfg.Slots, cfg.MaxLabels, cfg.Labels = 4, 4, 2, 8
	cfg.SimLoadTime, cfg.SimLoadJitter, cfg.SimRunTime, cfg.SimRunJitter = 20*time.Millisecond, 0, 5*time.Millisecond, 0
	cfg.LogLevel = "warn"
	fs := flag.NewFlagSet("benchmark soak", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.DurationVar(&cfg.Duration, "duration", 5*time.Minute, "how long to run at the soak rate")
	fs.Float64Var(&cfg.Rate, "rate", 0, "tasks per second; 0 measures capacity first and uses 80% of it")
	fs.DurationVar(&cfg.ProbeDuration, "probe", 10*time.Second, "how long the capacity probe runs")
	fs.IntVar(&cfg.Concurrency, "concurrency", 64, "requests in flight at most (the probe's closed-loop producers)")
	fs.DurationVar(&cfg.Retention, "task-retention", time.Second, "dispatcher --task-retention (short: the retained answers, rate × retention of them, follow the achieved rate and would swamp a leak check)")
	fs.Float64Var(&cfg.MaxGrowth, "max-growth", 0.10, "largest relative change of the dispatcher's memory allowed")
	fs.IntVar(&cfg.Labels, "labels", cfg.Labels, "number of labels")
	addClusterFlags(fs, &cfg.Config) // the same fleet flags as benchmark run
	quiet := fs.Bool("quiet", false, "no log lines on stderr")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	// !(x >= 0) also refuses NaN, which every comparison lets through.
	if fs.NArg() > 0 || cfg.Duration <= 0 || !(cfg.Rate >= 0) || math.IsInf(cfg.Rate, 0) || cfg.ProbeDuration <= 0 || cfg.Concurrency < 1 ||
		!(cfg.MaxGrowth > 0) || math.IsInf(cfg.MaxGrowth, 0) {
		fmt.Fprintln(stderr, "benchmark soak: --duration, --probe, --concurrency and --max-growth must be positive, --rate not negative, and no arguments")
		return 2
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(stderr, "benchmark soak: %v\n", err)
		return 2
	}
	if !*quiet {
		cfg.Logger = zerolog.New(zerolog.ConsoleWriter{Out: stderr, NoColor: !isTerminal(stderr), TimeFormat: time.TimeOnly}).
			With().Timestamp().Str("component", "soak").Logger()
	}
	res, err := live.Soak(ctx, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "benchmark soak: %v\n", err)
		switch {
		case errors.Is(err, live.ErrConfig): // refused before anything started
			return 2
		case ctx.Err() != nil:
			return 130
		}
		return 1
	}
	res.Write(stdout)
	if len(res.Failures()) > 0 {
		return 1
	}
	return 0
}
