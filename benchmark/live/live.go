// Package live is the live benchmark: it builds the dispatcher and the worker agent,
// starts a dispatcher and its agents (simulated backend) as real processes on
// loopback, runs the seed's closed-loop producers against it, stops everything, and
// reports what the agents' logs and the producers' records say.
package live

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/smartroute/smartroute/benchmark/internal/progress"
	"github.com/smartroute/smartroute/benchmark/producer"
	"github.com/smartroute/smartroute/benchmark/report"
	"github.com/smartroute/smartroute/benchmark/workerlog"
)

// Files each run leaves in its directory, besides the processes' logs.
const (
	recordsFile = "requests.jsonl"
	summaryFile = "summary.json"
)

// Run is `benchmark run`: it measures one mode, or both with cfg.Compare, and writes
// the report to stdout (text, or JSON with cfg.JSON) and the chart to cfg.ChartPath.
// A mode in which no task completed is an error, returned after the report.
func Run(ctx context.Context, cfg Config, stdout io.Writer) error {
	// Check the chart's path before measuring: a path that cannot be written must not
	// throw away minutes of measurement. The chart goes to a temporary file beside it,
	// renamed over it once written, so that a run that fails leaves the previous chart
	// as it was.
	var chart *os.File
	if cfg.ChartPath != "" && cfg.Compare {
		f, err := createChartTemp(cfg.ChartPath)
		if err != nil {
			return configError{fmt.Errorf("--chart: %w", err)}
		}
		chart = f
		defer func() {
			if chart != nil { // not written: leave nothing behind
				chart.Close()
				os.Remove(chart.Name())
			}
		}()
	}
	results, err := Measure(ctx, cfg)
	if err != nil {
		return err
	}
	// Reported after the results, whose summary shows what failed.
	failed := errors.Join(noTaskCompleted(results), earlyExits(results))
	if !cfg.Compare {
		if cfg.JSON {
			return errors.Join(report.WriteJSON(stdout, results[0]), failed)
		}
		return errors.Join(report.WriteText(stdout, results[0]), failed)
	}
	c := report.Comparison{Routing: results[0], Random: results[1]}
	// The results first: a chart that fails to write must not take them with it.
	var outErr error
	if cfg.JSON {
		outErr = report.WriteComparisonJSON(stdout, c)
	} else {
		outErr = report.WriteComparison(stdout, c)
	}
	if chart != nil {
		f := chart
		chart = nil
		if err := writeChart(f, cfg.ChartPath, c); err != nil {
			return errors.Join(outErr, err, failed)
		}
		cfg.Logger.Info().Str("path", cfg.ChartPath).Msg("chart written")
	}
	return errors.Join(outErr, failed)
}

// createChartTemp checks that the chart can be written to path without touching what
// is there (a file is opened for writing, not truncated), and creates the temporary
// file the chart is written to, in path's directory so that renaming it is atomic.
func createChartTemp(path string) (*os.File, error) {
	perm := os.FileMode(0o644)
	if fi, err := os.Stat(path); err == nil {
		if !fi.Mode().IsRegular() {
			return nil, fmt.Errorf("%s is not a regular file", path)
		}
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			return nil, err
		}
		f.Close()
		perm = fi.Mode().Perm() // the new chart keeps the old one's mode
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return nil, err
	}
	if err := f.Chmod(perm); err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, err
	}
	return f, nil
}

// noTaskCompleted fails a run in which some mode completed no task at all (every
// request failed): it measured nothing, however complete its summary looks.
func noTaskCompleted(results []report.Result) error {
	var errs []error
	for _, r := range results {
		if r.Producer.Completed == 0 {
			errs = append(errs, fmt.Errorf("%s: no task completed: all %d requests failed (records in %s)", r.Mode, r.Producer.Requests, r.OutDir))
		}
	}
	return errors.Join(errs...)
}

// earlyExits fails a run in which a process died before the stop: the run did not
// measure the fleet asked for, and its summary may be read from partial logs.
func earlyExits(results []report.Result) error {
	var errs []error
	for _, r := range results {
		for _, e := range r.EarlyExits {
			errs = append(errs, fmt.Errorf("%s: %s", r.Mode, e))
		}
	}
	return errors.Join(errs...)
}

// writeChart writes the chart to f, the temporary file, and renames it to path; on
// error it removes f and path is left as it was.
func writeChart(f *os.File, path string, c report.Comparison) error {
	err := report.WriteChart(f, c)
	err = errors.Join(err, f.Close())
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("--chart: %w", err)
	}
	return nil
}

// Measure runs the benchmark and returns one result, or with cfg.Compare two: routing
// then random dispatch, with the same seed and the same binaries.
func Measure(ctx context.Context, cfg Config) ([]report.Result, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, configError{err}
	}
	bins, cleanup, err := resolveBinaries(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer cleanup()

	outDir := cfg.OutDir
	if outDir == "" {
		if outDir, err = os.MkdirTemp("", "smartroute-bench-"); err != nil {
			return nil, fmt.Errorf("creating the output directory: %w", err)
		}
	} else if err := os.MkdirAll(outDir, 0o755); err != nil {
		return nil, fmt.Errorf("--out: %w", err)
	}
	cfg.Logger.Info().Str("dir", outDir).Msg("logs and records go here")

	modes := []bool{cfg.RandomDispatch}
	if cfg.Compare {
		modes = []bool{false, true}
	}
	var results []report.Result
	for _, random := range modes {
		r, err := runMode(ctx, cfg, bins, random, outDir)
		if err != nil {
			return nil, err
		}
		results = append(results, r)
	}
	return results, nil
}

// resolveBinaries finds the prebuilt binaries or builds them; cleanup removes a build.
func resolveBinaries(ctx context.Context, cfg Config) (binaries, func(), error) {
	if cfg.BinDir != "" {
		b, err := prebuilt(cfg.BinDir, cfg.Backend)
		return b, func() {}, err
	}
	repo := cfg.RepoDir
	if repo == "" {
		wd, err := os.Getwd()
		if err != nil {
			return binaries{}, nil, err
		}
		if repo, err = FindRepoRoot(wd); err != nil {
			return binaries{}, nil, configError{err} // run from elsewhere without --repo: bad usage
		}
	}
	dir, err := os.MkdirTemp("", "smartroute-bench-bin-")
	if err != nil {
		return binaries{}, nil, err
	}
	cleanup := func() { os.RemoveAll(dir) }
	start := time.Now()
	cfg.Logger.Info().Str("repo", repo).Msg("building the dispatcher and worker agent")
	b, err := Build(ctx, repo, dir)
	if err != nil {
		cleanup()
		return binaries{}, nil, err
	}
	cfg.Logger.Info().Dur("took", time.Since(start)).Msg("built")
	return b, cleanup, nil
}

func modeName(random bool) string {
	if random {
		return report.ModeRandom
	}
	return report.ModeRouting
}

// runMode starts a cluster in one mode, runs the producers, stops the cluster and
// sums up.
func runMode(ctx context.Context, cfg Config, bins binaries, random bool, outDir string) (report.Result, error) {
	mode := modeName(random)
	log := cfg.Logger.With().Str("mode", mode).Logger()
	cfg.Logger = log
	dir := filepath.Join(outDir, mode)
	if err := freshDir(dir); err != nil {
		return report.Result{}, err
	}
	runID := mode + "-" + strconv.FormatInt(time.Now().UnixMilli(), 36)

	cl, err := startCluster(ctx, clusterSpec{bins: bins, dir: dir, random: random, cfg: cfg, onProcessStart: cfg.onProcessStart})
	if err != nil {
		return report.Result{}, fmt.Errorf("%s: %w", mode, err)
	}
	defer cl.stop() // on every path; stopping twice is a no-op

	labels := make([]string, cfg.Labels)
	for i := range labels {
		labels[i] = fmt.Sprintf("label-%d", i+1)
	}
	log.Info().Int("requests", cfg.Requests).Int("producers", cfg.Producers).Str("run_id", runID).Msg("producers started")
	bar := progress.Start(cfg.Progress, mode, cfg.Requests, 200*time.Millisecond)
	records, runErr := producer.Run(ctx, producer.Config{
		BaseURL:        cl.baseURL,
		RunID:          runID,
		Requests:       cfg.Requests,
		Producers:      cfg.Producers,
		WaitAvg:        cfg.WaitAvg,
		WaitStddev:     cfg.WaitStddev,
		Labels:         labels,
		TaskTypes:      cfg.TaskTypes,
		Parameters:     cfg.Parameters,
		SyncShare:      cfg.SyncShare,
		Seed:           uint64(cfg.Seed),
		TimeScale:      cfg.TimeScale,
		RequestTimeout: cfg.RequestTimeout,
		OnResult:       func(r producer.Record) { bar.Add(r.OK) },
	})
	bar.Finish()
	writeErr := writeRecords(filepath.Join(dir, recordsFile), records)

	// The logs are complete only once the agents have exited.
	if err := cl.stop(); err != nil {
		log.Warn().Err(err).Msg("the cluster did not stop cleanly: the logs the summary is read from may be incomplete")
	}
	if runErr != nil {
		return report.Result{}, fmt.Errorf("%s: producers stopped after %d of %d requests: %w", mode, len(records), cfg.Requests, runErr)
	}
	if writeErr != nil {
		return report.Result{}, writeErr
	}
	paths, err := cl.agentLogs()
	if err != nil {
		return report.Result{}, err
	}
	ws, err := readWorkerLogs(paths)
	if err != nil {
		return report.Result{}, err
	}
	res := report.Result{
		Mode:     mode,
		RunID:    runID,
		Settings: settings(cfg),
		Worker:   ws,
		Producer: producer.Summarize(records),
		OutDir:   dir,
	}
	for _, err := range cl.earlyExits() {
		res.EarlyExits = append(res.EarlyExits, err.Error())
	}
	for _, n := range report.Notes(res) {
		log.Warn().Msg(n)
	}
	if err := writeSummary(filepath.Join(dir, summaryFile), res); err != nil {
		return report.Result{}, err
	}
	log.Info().Int("completed", res.Producer.Completed).Int("failed", res.Producer.Failed).Int("label_misses", ws.LabelMisses).Msg("run done")
	return res, nil
}

// readWorkerLogs sums up the agents' logs, as stored by the log collector.
func readWorkerLogs(paths []string) (workerlog.Summary, error) {
	files, err := openLogs(paths)
	if err != nil {
		return workerlog.Summary{}, fmt.Errorf("opening the worker logs: %w", err)
	}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	readers := make([]io.Reader, len(files))
	for i, f := range files {
		readers[i] = f
	}
	return workerlog.Summarize(readers...)
}

func settings(cfg Config) report.Settings {
	return report.Settings{
		Workers:     cfg.NumWorkers,
		MaxLabels:   cfg.MaxLabels,
		Slots:       cfg.Slots,
		Requests:    cfg.Requests,
		Producers:   cfg.Producers,
		Labels:      cfg.Labels,
		WaitAvg:     cfg.WaitAvg,
		WaitStddev:  cfg.WaitStddev,
		SyncShare:   cfg.SyncShare,
		TimeScale:   cfg.TimeScale,
		Seed:        cfg.Seed,
		Backend:     cfg.Backend,
		SimLoadTime: cfg.SimLoadTime,
		SimRunTime:  cfg.SimRunTime,
	}
}

// writeRecords writes the producers' records as JSON lines.
func writeRecords(path string, records []producer.Record) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	enc := json.NewEncoder(w)
	for _, r := range records {
		if err := enc.Encode(r); err != nil {
			f.Close()
			return err
		}
	}
	return errors.Join(w.Flush(), f.Close())
}

func writeSummary(path string, r report.Result) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	return errors.Join(report.WriteJSON(f, r), f.Close())
}
