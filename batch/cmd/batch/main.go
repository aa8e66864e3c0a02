// Command batch runs a JSON-lines file of tasks through a smartroute dispatcher and
// writes line n of the output for input line n, exactly once, resuming from its
// checkpoint when run again after any stop (Ctrl-C, a crash, kill -9).
//
//	batch --dispatcher http://127.0.0.1:8080 --input in.jsonl --output out.jsonl
//
// Every flag also reads the environment variable named like it in upper case with
// dashes as underscores (--work-timeout → WORK_TIMEOUT); the command line wins. The
// flags are in README.md "Batch jobs". Exit status: 0 when every line is written
// (some may be rejected), 1 on an error, 2 on bad usage, 130 when interrupted (run it
// again to resume).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"

	"github.com/smartroute/smartroute/batch"
)

func main() {
	code, err := run()
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "batch:", err)
	}
	os.Exit(code)
}

func run() (int, error) {
	var cfg batch.Config
	fs := flag.NewFlagSet("batch", flag.ContinueOnError)
	fs.StringVar(&cfg.DispatcherURL, "dispatcher", "http://127.0.0.1:8080", "the dispatcher's base URL")
	fs.StringVar(&cfg.APIKey, "api-key", "", "producer API key, sent as Authorization: Bearer KEY")
	fs.StringVar(&cfg.Input, "input", "", "JSON-lines file of tasks (required)")
	fs.StringVar(&cfg.Output, "output", "", "JSON-lines file of results, line n for input line n (required)")
	fs.StringVar(&cfg.Rejected, "rejected", "", "lines that could not be run, with the reason (default <output>.rejected.jsonl)")
	fs.StringVar(&cfg.Checkpoint, "checkpoint", "", "progress file (default <output>.checkpoint)")
	fs.IntVar(&cfg.Concurrency, "concurrency", 64, "tasks in flight at once")
	fs.DurationVar(&cfg.WorkTimeout, "work-timeout", batch.DefaultWorkTimeout, "an item unanswered for this long is issued again; keep it above the dispatcher's --task-timeout plus 5 s (changeable while running: POST /work-timeout)")
	fs.IntVar(&cfg.MaxAttempts, "max-attempts", 3, "timeouts and failed answers before an item goes to the rejected file")
	fs.DurationVar(&cfg.RetryDelay, "retry-delay", time.Second, "wait after a failed answer before issuing the item again; doubles with each, at least the answer's Retry-After")
	fs.IntVar(&cfg.Lookahead, "lookahead", 0, "read but not yet issued lines the label order chooses from (0: half of --max-out-of-order)")
	fs.IntVar(&cfg.LabelsAtOnce, "labels-at-once", 3, "label passes issued in turn (well under the labels the fleet holds at once)")
	fs.IntVar(&cfg.MaxOutOfOrder, "max-out-of-order", 10000, "lines held from the oldest unwritten one to the newest read one; reading stops when full")
	fs.Int64Var(&cfg.MaxWindowBytes, "max-window-bytes", 256<<20, "memory the held lines may take: unanswered input lines and answers waiting for an earlier line; reading and issuing (but the oldest line) stop when full")
	fs.IntVar(&cfg.MaxLineBytes, "max-line-bytes", 1<<20, "longer input lines are rejected")
	fs.StringVar(&cfg.Fields.Label, "label-field", "label", "input field holding the label")
	fs.StringVar(&cfg.Fields.TaskType, "task-type-field", "task_type", "input field holding the task type")
	fs.StringVar(&cfg.Fields.Parameters, "parameters-field", "parameters", "input field holding the parameters (a JSON object, array, or a string holding JSON)")
	fs.StringVar(&cfg.Fields.ID, "id-field", "id", "input field copied to the output line when present")
	fs.StringVar(&cfg.DefaultTaskType, "default-task-type", "", "task type of lines without one (empty: required)")
	order := fs.String("order", "label", "label: group submissions by label within the look-ahead; file: file order")
	fs.DurationVar(&cfg.CheckpointInterval, "checkpoint-interval", time.Second, "how often written results are made durable and checkpointed")
	fs.StringVar(&cfg.ControlAddr, "control-addr", "", "serve POST /work-timeout and GET /status on this loopback address (off when empty)")
	progress := fs.String("progress", "auto", "progress bar on stderr: auto (when a terminal), true, false")
	jsonOut := fs.Bool("json", false, "print the summary as JSON on stdout")
	logLevel := fs.String("log-level", "info", "log level (JSON on stderr)")
	fs.VisitAll(func(f *flag.Flag) { f.Usage += " (env " + envName(f.Name) + ")" })
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, err // asked for: not bad usage
		}
		return 2, err
	}
	if fs.NArg() > 0 {
		return 2, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if err := fromEnv(fs); err != nil {
		return 2, err
	}
	cfg.Order = batch.Order(*order)
	// In Config zero means the default; typed on the command line (or in the
	// environment) it is a mistake: --max-attempts 0 ran three attempts, --retry-delay 0
	// waited a second. --lookahead documents 0 as its default.
	var zeros []string
	for _, f := range []struct {
		name string
		zero bool
	}{
		{"concurrency", cfg.Concurrency == 0}, {"work-timeout", cfg.WorkTimeout == 0}, {"max-attempts", cfg.MaxAttempts == 0},
		{"retry-delay", cfg.RetryDelay == 0}, {"labels-at-once", cfg.LabelsAtOnce == 0}, {"max-out-of-order", cfg.MaxOutOfOrder == 0},
		{"max-window-bytes", cfg.MaxWindowBytes == 0}, {"max-line-bytes", cfg.MaxLineBytes == 0}, {"checkpoint-interval", cfg.CheckpointInterval == 0},
	} {
		if f.zero {
			zeros = append(zeros, "--"+f.name)
		}
	}
	if len(zeros) > 0 {
		return 2, fmt.Errorf("%s must be more than 0 (leave a flag out for its default)", strings.Join(zeros, ", "))
	}
	level, err := zerolog.ParseLevel(*logLevel)
	if err == nil && level == zerolog.NoLevel { // "": every record filtered out, silently
		err = errors.New("empty; want trace, debug, info, warn, error, fatal, panic or disabled")
	}
	if err != nil {
		return 2, fmt.Errorf("--log-level: %w", err)
	}
	cfg.Logger = zerolog.New(os.Stderr).Level(level).With().Timestamp().Logger()
	switch *progress {
	case "auto":
		if isatty.IsTerminal(os.Stderr.Fd()) {
			cfg.Progress = os.Stderr
		}
	case "true":
		cfg.Progress = os.Stderr
	case "false":
	default:
		return 2, fmt.Errorf("--progress must be auto, true or false, got %q", *progress)
	}
	// After the first signal the job stops in order (last checkpoint); a second one
	// ends it at once, should that stop hang on a stuck disk. The handler is let go
	// before the job is told, so no second signal can fall between the two.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, os.Interrupt)
	defer signal.Stop(sigs)
	go func() {
		select {
		case <-sigs:
			signal.Stop(sigs)
			cancel()
		case <-ctx.Done():
		}
	}()
	s, err := batch.Run(ctx, cfg)
	if s.JobID != "" {
		if *jsonOut {
			b, _ := json.Marshal(s)
			fmt.Println(string(b))
		} else {
			fmt.Printf("job %s (%s order): %d lines from line %d in %.1fs (%.1f items/s): %d completed, %d rejected; %d label loads; %d issued, %d reissued\n",
				s.JobID, s.Order, s.Lines, s.StartLine, s.Seconds, s.PerSec, s.Completed, s.Rejected, s.LabelMisses, s.Issued, s.Reissued)
		}
	}
	switch {
	case err == nil:
		return 0, nil
	case errors.Is(err, batch.ErrConfig):
		return 2, err
	case errors.Is(err, context.Canceled):
		return 130, errors.New("interrupted; the written lines are checkpointed: run the same command again to resume")
	}
	return 1, err
}

func envName(flagName string) string {
	return strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// fromEnv sets every flag not given on the command line from its environment variable.
func fromEnv(fs *flag.FlagSet) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		name := envName(f.Name)
		if v, ok := os.LookupEnv(name); ok && v != "" && !given[f.Name] {
			if err := f.Value.Set(v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %w", name, v, err))
			}
		}
	})
	return errors.Join(errs...)
}
