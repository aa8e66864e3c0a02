package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/smartroute/smartroute/batch"
	"github.com/smartroute/smartroute/benchmark/live"
)

// batchCompare is `benchmark batch-compare`: the same batch job with label-aware
// ordering and in file order, each on a fresh fleet of simulated agents.
//
//	go run ./batch/cmd/gen-input --lines 100000 --labels 20 --skew 1 --output in.jsonl
//	go run ./benchmark/cmd/benchmark batch-compare --input in.jsonl
//
// Exit status: 0 on success, 1 when a job failed, 2 on bad usage (every flag, the
// input and each order's job settings are checked before anything is built), 130
// when interrupted.
func batchCompare(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	bc := live.BatchCompareConfig{Cluster: live.DefaultConfig()}
	// A fleet that runs a 100,000-line job in minutes on a small machine.
	bc.Cluster.NumWorkers, bc.Cluster.MaxLabels, bc.Cluster.Slots = 8, 2, 4
	bc.Cluster.SimLoadTime, bc.Cluster.SimLoadJitter = 100*time.Millisecond, 10*time.Millisecond
	bc.Cluster.SimRunTime, bc.Cluster.SimRunJitter = 5*time.Millisecond, time.Millisecond
	bc.Cluster.LogLevel = "warn"
	fs := flag.NewFlagSet("benchmark batch-compare", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&bc.Input, "input", "", "JSON-lines file of tasks (batch/cmd/gen-input writes one); required")
	orders := fs.String("orders", "label,file", "comma-separated orders to run, in turn")
	fs.IntVar(&bc.Concurrency, "concurrency", 64, "the batch job's tasks in flight")
	fs.IntVar(&bc.Lookahead, "lookahead", 0, "the batch job's look-ahead (0: its default)")
	fs.IntVar(&bc.LabelsAtOnce, "labels-at-once", 0, "the batch job's labels issued in turn (0: its default)")
	fs.IntVar(&bc.MaxOutOfOrder, "max-out-of-order", 0, "the batch job's reorder window (0: its default)")
	fs.Int64Var(&bc.Cluster.Seed, "seed", bc.Cluster.Seed, "seed of the agents' simulated jitter")
	addClusterFlags(fs, &bc.Cluster)
	fs.BoolVar(&bc.JSON, "json", false, "print the results as JSON on stdout")
	quiet := fs.Bool("quiet", false, "no log lines on stderr")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "benchmark batch-compare: unexpected arguments %q\n", fs.Args())
		return 2
	}
	for _, o := range strings.Split(*orders, ",") {
		o = strings.TrimSpace(o)
		// batch reads an empty order as its default: "label," would run label twice.
		if o == "" || slices.Contains(bc.Orders, batch.Order(o)) {
			fmt.Fprintf(stderr, "benchmark batch-compare: --orders %q: want distinct orders (label, file), comma-separated\n", *orders)
			return 2
		}
		bc.Orders = append(bc.Orders, batch.Order(o))
	}
	terminal := isTerminal(stderr)
	if terminal && !bc.JSON {
		bc.Cluster.Progress = stderr
	}
	if !*quiet {
		bc.Cluster.Logger = zerolog.New(zerolog.ConsoleWriter{Out: stderr, NoColor: !terminal, TimeFormat: time.TimeOnly}).
			With().Timestamp().Str("component", "benchmark").Logger()
	}
	if err := live.BatchCompare(ctx, bc, stdout); err != nil {
		fmt.Fprintf(stderr, "benchmark batch-compare: %v\n", err)
		switch {
		case errors.Is(err, live.ErrConfig): // refused before anything started
			return 2
		case ctx.Err() != nil:
			return 130
		}
		return 1
	}
	return 0
}
