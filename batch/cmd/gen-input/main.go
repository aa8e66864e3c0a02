// Command gen-input writes a JSON-lines input for the batch job: --lines tasks over
// --labels labels whose popularity falls as 1/rank^--skew (0: uniform), in random
// order, reproducible with --seed.
//
//	go run ./batch/cmd/gen-input --lines 100000 --labels 20 --skew 1 --output in.jsonl
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
)

func main() {
	if err := run(); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0) // asked for, as the other commands answer -h
		}
		fmt.Fprintln(os.Stderr, "gen-input:", err)
		os.Exit(1)
	}
}

func run() error {
	fs := flag.NewFlagSet("gen-input", flag.ContinueOnError)
	lines := fs.Int("lines", 100000, "tasks to write")
	labels := fs.Int("labels", 20, "distinct labels, named label-1..N")
	skew := fs.Float64("skew", 1, "label k has weight 1/k^skew (0: uniform)")
	seed := fs.Uint64("seed", 1, "random seed")
	taskType := fs.String("task-type", "sample_task", "task type of every line")
	out := fs.String("output", "", "file to write (required)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return err
	}
	if *out == "" || *lines < 1 || *labels < 1 || *skew < 0 {
		return errors.New("--output is required; --lines and --labels must be positive, --skew not negative")
	}
	// Cumulative weights, for picking a label by binary search.
	cum := make([]float64, *labels)
	total := 0.0
	for k := range cum {
		total += 1 / math.Pow(float64(k+1), *skew)
		cum[k] = total
	}
	rng := rand.New(rand.NewPCG(*seed, 0))
	f, err := os.Create(*out)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	for i := 1; i <= *lines; i++ {
		k, _ := slices.BinarySearch(cum, rng.Float64()*total)
		fmt.Fprintf(w, "{\"id\":%d,\"label\":\"label-%d\",\"task_type\":%q,\"parameters\":{\"n\":%d}}\n", i, min(k, *labels-1)+1, *taskType, i)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	return f.Close()
}
