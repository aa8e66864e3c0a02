package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/smartroute/smartroute/benchmark/sim"
)

// simulate replays a scenario through routing policies on a virtual clock:
//
//	benchmark simulate [--scenario seed-4|seed-5|fleet|FILE] [--policies random,seed-greedy,ray-like,ours]
//	                   [--seed N] [--json] [--chart FILE] [--max-pass-over D]
//
// FILE is a YAML or JSON scenario (schema in the README). Output: a table on stdout, or
// with --json the report as JSON and nothing else.
func simulate(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("benchmark simulate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	scenario := fs.String("scenario", "seed-4", "built-in scenario (seed-4, seed-5, fleet) or a YAML/JSON file")
	policies := fs.String("policies", strings.Join(sim.Policies, ","), "comma-separated policies to compare")
	seed := fs.Uint64("seed", 1, "seed of the workload and of random choices")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	chart := fs.String("chart", "", "write an SVG chart of the comparison to this file")
	var opt sim.Options
	fs.DurationVar(&opt.MaxPassOver, "max-pass-over", 0, "ours: floor of how long a task may be passed over (0: the scheduler's default, 2s)")
	fs.Float64Var(&opt.PassOverLoads, "pass-over-loads", 0, "ours: how long a task may be passed over, in loads of its label (0: the scheduler's default, 100)")
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "benchmark simulate: unexpected arguments %q\n", fs.Args())
		return 2
	}
	sc, err := sim.Load(*scenario)
	if err != nil {
		fmt.Fprintf(stderr, "benchmark simulate: %v\n", err)
		return 2
	}
	rep, err := sim.Compare(sc, strings.Split(*policies, ","), *seed, opt)
	if err != nil {
		fmt.Fprintf(stderr, "benchmark simulate: %v\n", err)
		return 2
	}
	if *chart != "" {
		f, err := os.Create(*chart)
		if err == nil {
			err = rep.WriteChart(f)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			fmt.Fprintf(stderr, "benchmark simulate: --chart: %v\n", err)
			return 1
		}
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return 1
		}
		return 0
	}
	if err := rep.WriteTable(stdout); err != nil {
		return 1
	}
	return 0
}
