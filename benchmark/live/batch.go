package live

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"

	"github.com/smartroute/smartroute/batch"
)

// BatchCompareConfig is `benchmark batch-compare`: one batch job per order, each on a
// fresh cluster (cold labels) started from Cluster's settings.
type BatchCompareConfig struct {
	// Cluster gives the binaries, the fleet (NumWorkers, MaxLabels, Slots), the
	// simulated load and run times, OutDir and the logger; its producer fields are unused.
	Cluster Config
	// Input is the JSON-lines file of tasks (batch/cmd/gen-input writes one). Required.
	Input string
	// Orders are run in turn. Zero means label, then file.
	Orders []batch.Order
	// Concurrency, Lookahead and MaxOutOfOrder are the job's; zero means batch's default.
	Concurrency, Lookahead, MaxOutOfOrder, LabelsAtOnce int
	// JSON prints the results as JSON instead of a table.
	JSON bool
}

// BatchResult is one order's job.
type BatchResult struct {
	Order batch.Order   `json:"order"`
	Job   batch.Summary `json:"job"`
	// AgentLabelLoads counts the label misses the agents logged (the collector's
	// records): the same loads as Job.LabelMisses seen from the fleet's side.
	AgentLabelLoads int    `json:"agent_label_loads"`
	OutDir          string `json:"out_dir"`
	// EarlyExits are the processes that died before the cluster was stopped: the job
	// ran on a smaller fleet than asked for, and the agents' count may be partial.
	EarlyExits []string `json:"early_exits,omitempty"`
}

// Validate checks bc before anything is built or started: the fleet, the input, and
// each order's batch job as batch.Run would check it. Each error names the flag.
func (bc BatchCompareConfig) Validate() error {
	errs := []error{bc.Cluster.withDefaults().Validate()}
	if bc.Input == "" {
		return errors.Join(append(errs, errors.New("--input is required"))...)
	}
	if fi, err := os.Stat(bc.Input); err != nil {
		errs = append(errs, fmt.Errorf("--input: %w", err))
	} else if fi.IsDir() {
		errs = append(errs, fmt.Errorf("--input %s is a directory", bc.Input))
	}
	// The orders' jobs share their other settings: a problem with those is told once.
	var job []error
	seen := map[string]bool{}
	for _, order := range bc.orders() {
		// Without --out the output goes to a new temporary directory, which cannot hold
		// the input: any other name does for the check.
		out := bc.Input + ".out"
		if bc.Cluster.OutDir != "" {
			out = filepath.Join(bc.Cluster.OutDir, orderDir(order), outFile)
		}
		err := bc.jobConfig(order, "http://127.0.0.1", out).WithDefaults().Validate()
		for _, e := range unjoin(err) {
			if !seen[e.Error()] {
				seen[e.Error()] = true
				job = append(job, e)
			}
		}
	}
	if len(job) > 0 {
		errs = append(errs, fmt.Errorf("batch job (--orders, --concurrency, --lookahead, --labels-at-once, --max-out-of-order): %w", errors.Join(job...)))
	}
	return errors.Join(errs...)
}

// unjoin is the errors errors.Join made err of, or err alone.
func unjoin(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

func (bc BatchCompareConfig) orders() []batch.Order {
	if len(bc.Orders) == 0 {
		return []batch.Order{batch.OrderLabel, batch.OrderFile}
	}
	return bc.Orders
}

func orderDir(order batch.Order) string { return "batch-" + string(order) }

// outFile is the job's output, in its order's directory.
const outFile = "out.jsonl"

// jobConfig is the batch job of one order, against the dispatcher at url.
func (bc BatchCompareConfig) jobConfig(order batch.Order, url, output string) batch.Config {
	return batch.Config{
		DispatcherURL: url,
		Input:         bc.Input,
		Output:        output,
		Concurrency:   bc.Concurrency,
		Lookahead:     bc.Lookahead,
		MaxOutOfOrder: bc.MaxOutOfOrder,
		LabelsAtOnce:  bc.LabelsAtOnce,
		Order:         order,
	}
}

// BatchCompare runs the comparison and prints it to stdout.
func BatchCompare(ctx context.Context, bc BatchCompareConfig, stdout io.Writer) error {
	if err := bc.Validate(); err != nil {
		return configError{err}
	}
	cfg := bc.Cluster.withDefaults()
	bc.Orders = bc.orders()
	bins, cleanup, err := resolveBinaries(ctx, cfg)
	if err != nil {
		return err
	}
	defer cleanup()
	outDir := cfg.OutDir
	if outDir == "" {
		if outDir, err = os.MkdirTemp("", "smartroute-batch-"); err != nil {
			return err
		}
	}
	var results []BatchResult
	for _, order := range bc.Orders {
		r, err := runBatchOrder(ctx, cfg, bc, bins, order, filepath.Join(outDir, orderDir(order)))
		if err != nil {
			return fmt.Errorf("%s order: %w", order, err)
		}
		results = append(results, r)
	}
	// A process that died fails the comparison, as it fails `run`: reported after the
	// results, which show what the job did without it.
	var died []error
	for _, r := range results {
		for _, e := range r.EarlyExits {
			died = append(died, fmt.Errorf("%s order: %s", r.Order, e))
		}
	}
	if bc.JSON {
		return errors.Join(json.NewEncoder(stdout).Encode(results), errors.Join(died...))
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "order\tlines\tcompleted\trejected\tlabel loads (answers)\tlabel loads (agents)\twall s\titems/s\t")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%.1f\t%.0f\t\n", r.Order, r.Job.Lines, r.Job.Completed, r.Job.Rejected,
			r.Job.LabelMisses, r.AgentLabelLoads, r.Job.Seconds, r.Job.PerSec)
	}
	err = tw.Flush()
	for _, e := range died {
		fmt.Fprintf(stdout, "\nNote: %s\n", e)
	}
	return errors.Join(err, errors.Join(died...))
}

func runBatchOrder(ctx context.Context, cfg Config, bc BatchCompareConfig, bins binaries, order batch.Order, dir string) (BatchResult, error) {
	if err := freshDir(dir); err != nil {
		return BatchResult{}, err
	}
	log := cfg.Logger.With().Str("order", string(order)).Logger()
	cl, err := startCluster(ctx, clusterSpec{bins: bins, dir: dir, cfg: cfg, onProcessStart: cfg.onProcessStart})
	if err != nil {
		return BatchResult{}, err
	}
	defer cl.stop()
	out := filepath.Join(dir, outFile)
	log.Info().Str("input", bc.Input).Msg("batch job started")
	job := bc.jobConfig(order, cl.baseURL, out)
	job.Progress, job.Logger = cfg.Progress, log
	s, jobErr := batch.Run(ctx, job)
	// The agents' logs are complete only once they have exited.
	if err := cl.stop(); err != nil {
		log.Warn().Err(err).Msg("the cluster did not stop cleanly: the agents' label loads are read from logs that may be incomplete")
	}
	if jobErr != nil {
		return BatchResult{}, jobErr
	}
	paths, err := cl.agentLogs()
	if err != nil {
		return BatchResult{}, err
	}
	ws, err := readWorkerLogs(paths)
	if err != nil {
		return BatchResult{}, err
	}
	r := BatchResult{Order: order, Job: s, AgentLabelLoads: ws.LabelMisses, OutDir: dir}
	for _, err := range cl.earlyExits() {
		r.EarlyExits = append(r.EarlyExits, err.Error())
	}
	b, _ := json.MarshalIndent(r, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, summaryFile), b, 0o644); err != nil {
		return BatchResult{}, err
	}
	log.Info().Int64("lines", s.Lines).Int64("label_misses", s.LabelMisses).Int("agent_label_loads", ws.LabelMisses).Float64("seconds", s.Seconds).Msg("batch job done")
	return r, nil
}
