package main

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/smartroute/smartroute/benchmark/live"
)

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// stubBinDir is a --bin-dir that passes the checks of usage: every binary is there
// and executable, and each exits 1 at once when started.
func stubBinDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{"dispatcher", "worker-agent", "log-collector", "fake-triton"} {
		if runtime.GOOS == "windows" {
			name += ".exe"
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\nexit 1\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestParseRunDefaults(t *testing.T) {
	t.Parallel()
	cfg, err := parseRun(nil, env(nil), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	def := live.DefaultConfig()
	if cfg.Requests != 10 || cfg.Producers != 2 || cfg.WaitAvg != time.Second || cfg.WaitStddev != 500*time.Millisecond ||
		cfg.Labels != 4 || len(cfg.TaskTypes) != 0 || cfg.Backend != "" || cfg.SyncShare != 1 || cfg.Seed != 1 ||
		cfg.TimeScale != 1 || cfg.NumWorkers != 2 || cfg.RandomDispatch || cfg.SimLoadTime != def.SimLoadTime ||
		cfg.SimRunTime != def.SimRunTime || cfg.Compare || cfg.JSON {
		t.Errorf("defaults: %+v", cfg)
	}
	// A bytes.Buffer is no terminal: no progress bar.
	if cfg.Progress != nil {
		t.Error("progress bar on a non-terminal")
	}
}

func TestParseRunFlagsAndEnv(t *testing.T) {
	t.Parallel()
	args := strings.Fields("--requests 2400 --producers 3 --labels 5 --wait-avg 0.75 --wait-stddev 1.0 " +
		"--time-scale 0.1 --task-types a,b --sync-share 0.5 --seed 9 --sim-load-time 300ms --compare --chart c.svg --json")
	cfg, err := parseRun(args, env(map[string]string{"NUM_WORKERS": "4", "RANDOM_DISPATCH": "true"}), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Requests != 2400 || cfg.Producers != 3 || cfg.Labels != 5 || cfg.WaitAvg != 750*time.Millisecond ||
		cfg.WaitStddev != time.Second || cfg.TimeScale != 0.1 || !slices.Equal(cfg.TaskTypes, []string{"a", "b"}) ||
		cfg.SyncShare != 0.5 || cfg.Seed != 9 || cfg.SimLoadTime != 300*time.Millisecond || !cfg.Compare ||
		cfg.ChartPath != "c.svg" || !cfg.JSON || cfg.NumWorkers != 4 || !cfg.RandomDispatch {
		t.Errorf("parsed: %+v", cfg)
	}
	// Flags win over the environment.
	cfg, err = parseRun([]string{"--num-workers", "3", "--random-dispatch=false"}, env(map[string]string{"NUM_WORKERS": "4", "RANDOM_DISPATCH": "1"}), &bytes.Buffer{})
	if err != nil || cfg.NumWorkers != 3 || cfg.RandomDispatch {
		t.Errorf("flags over env: %+v, %v", cfg, err)
	}
}

func TestParseRunErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--requests", "0"}, nil, "--requests"},
		{[]string{"--time-scale", "-1"}, nil, "--time-scale"},
		{[]string{"--wait-avg", "-2"}, nil, "--wait-avg"},
		{[]string{"--chart", "x.svg"}, nil, "--chart needs --compare"},
		{[]string{"--task-types", "a,,b"}, nil, "--task-types"},
		{[]string{"extra"}, nil, "unexpected arguments"},
		{nil, map[string]string{"NUM_WORKERS": "two"}, "NUM_WORKERS"},
		{nil, map[string]string{"RANDOM_DISPATCH": "maybe"}, "RANDOM_DISPATCH"},
		{nil, map[string]string{"NUM_WORKERS": "0"}, "--num-workers (NUM_WORKERS)"},
		{[]string{"--requests", "ten"}, nil, "-requests"},
		// Every request would be refused (400): the stack must not even start.
		{[]string{"--parameters", "notjson"}, nil, `--parameters must be JSON, got "notjson"`},
	}
	for _, tt := range tests {
		_, err := parseRun(tt.args, env(tt.env), &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q %v: err = %v, want one naming %s", tt.args, tt.env, err, tt.want)
		}
	}
	_, err := parseRun([]string{"-h"}, env(nil), &bytes.Buffer{})
	if !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v", err)
	}
}

// Seconds a Duration cannot hold are refused naming the flag and the value given; they
// used to wrap around and be reported as a negative pause.
func TestParseRunSecondsOutOfRange(t *testing.T) {
	t.Parallel()
	tests := []struct{ flag, value, want string }{
		{"--wait-avg", "1e300", "--wait-avg must be a number of seconds a duration can hold (at most 9223372036), got 1e+300"},
		{"--wait-avg", "NaN", "--wait-avg must be a number of seconds a duration can hold (at most 9223372036), got NaN"},
		{"--wait-avg", "+Inf", "got +Inf"},
		{"--wait-stddev", "-Inf", "--wait-stddev must be a number of seconds a duration can hold (at most 9223372036), got -Inf"},
		{"--wait-stddev", "9.3e9", "--wait-stddev must be a number of seconds a duration can hold (at most 9223372036), got 9.3e+09"},
		// The scale multiplies every duration: the scaled ones must fit too.
		{"--time-scale", "1e300", "--time-scale 1e+300 makes"},
	}
	for _, tt := range tests {
		_, err := parseRun([]string{tt.flag, tt.value}, env(nil), &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "negative") {
			t.Errorf("%s %s: err = %v, want one containing %q", tt.flag, tt.value, err, tt.want)
		}
	}
	// The largest whole number of seconds a duration holds is still taken.
	if cfg, err := parseRun([]string{"--wait-avg", "9223372036"}, env(nil), &bytes.Buffer{}); err != nil || cfg.WaitAvg != 9223372036*time.Second {
		t.Errorf("--wait-avg 9223372036: %v, %v", cfg.WaitAvg, err)
	}
}

func TestRunCommands(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args     []string
		code     int
		out, err string
	}{
		{nil, 2, "", "usage: benchmark"},
		{[]string{"help"}, 0, "usage: benchmark", ""},
		{[]string{"frobnicate"}, 2, "", `unknown command "frobnicate"`},
		{[]string{"run", "--requests", "0"}, 2, "", "benchmark run: --requests must be at least 1"},
		{[]string{"run", "-h"}, 0, "", "-time-scale"},
		// Refused before anything starts (the stubs would fail later with 1): bad usage.
		{[]string{"run", "--quiet", "--bin-dir", stubBinDir(t), "--compare", "--chart", filepath.Join(t.TempDir(), "missing", "x.svg")}, 2, "", "benchmark run: --chart: "},
		// NaN passes every comparison: it was taken as a rate and a growth bound.
		{[]string{"soak", "--rate", "NaN"}, 2, "", "--rate not negative"},
		{[]string{"soak", "--max-growth", "NaN"}, 2, "", "--max-growth must be positive"},
		{[]string{"soak", "--rate", "+Inf"}, 2, "", "--rate not negative"},
	}
	for _, tt := range tests {
		var stdout, stderr bytes.Buffer
		code := run(t.Context(), tt.args, env(nil), &stdout, &stderr)
		if code != tt.code || !strings.Contains(stdout.String(), tt.out) || !strings.Contains(stderr.String(), tt.err) {
			t.Errorf("%q: code %d stdout %q stderr %q", tt.args, code, stdout.String(), stderr.String())
		}
	}
}

func TestParseRunScenario(t *testing.T) {
	t.Parallel()
	cfg, err := parseRun([]string{"--compare", "--scenario", "seed-4"}, env(nil), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Requests != 2400 || cfg.Labels != 4 || cfg.WaitAvg != 750*time.Millisecond || cfg.WaitStddev != time.Second ||
		cfg.TimeScale != 0.05 || cfg.NumWorkers != 2 || cfg.MaxLabels != 2 || !cfg.Compare ||
		cfg.SimLoadTime != 400*time.Millisecond || cfg.SimRunTime != 40*time.Millisecond {
		t.Errorf("seed-4: %+v", cfg)
	}
	// Environment and flags given with a scenario override it.
	cfg, err = parseRun([]string{"--scenario=seed-5", "--requests", "100"}, env(map[string]string{"NUM_WORKERS": "3"}), &bytes.Buffer{})
	if err != nil || cfg.Labels != 5 || cfg.WaitAvg != 2500*time.Millisecond || cfg.Requests != 100 || cfg.NumWorkers != 3 ||
		cfg.SimLoadTime != 400*time.Millisecond || cfg.SimRunTime != 87500*time.Microsecond {
		t.Errorf("seed-5 with overrides: %+v %v", cfg, err)
	}
	// Given twice (task compare passes seed-4, then the user's), the last wins, as for
	// any flag.
	cfg, err = parseRun([]string{"--compare", "--scenario", "seed-4", "--scenario", "seed-5"}, env(nil), &bytes.Buffer{})
	if err != nil || cfg.Labels != 5 || cfg.WaitAvg != 2500*time.Millisecond || cfg.TimeScale != 0.02 {
		t.Errorf("--scenario seed-4 --scenario seed-5: %+v %v", cfg, err)
	}
	if _, err := parseRun([]string{"--scenario", "seed-9"}, env(nil), &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "seed-4") {
		t.Errorf("unknown scenario: %v", err)
	}
}

func TestSimulateCommand(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	chart := t.TempDir() + "/c.svg"
	if code := run(t.Context(), []string{"simulate", "--scenario", "seed-4", "--policies", "random,ours", "--chart", chart}, env(nil), &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	if !strings.Contains(out.String(), "ours") || !strings.Contains(out.String(), "random") {
		t.Fatalf("table:\n%s", out.String())
	}
	out.Reset()
	if code := run(t.Context(), []string{"simulate", "--scenario", "seed-4", "--json"}, env(nil), &out, &errOut); code != 0 || !strings.HasPrefix(out.String(), "{") {
		t.Fatalf("json: %d %q", code, out.String())
	}
	if code := run(t.Context(), []string{"simulate", "--scenario", "nope"}, env(nil), &out, &errOut); code != 2 {
		t.Fatalf("unknown scenario: exit %d", code)
	}
	if code := run(t.Context(), []string{"simulate", "--policies", "fastest"}, env(nil), &out, &errOut); code != 2 {
		t.Fatalf("unknown policy: exit %d", code)
	}
}

// BACKEND and --backend choose the agents' backend; a bad one names the flag.
func TestParseRunBackend(t *testing.T) {
	t.Parallel()
	cfg, err := parseRun(nil, env(map[string]string{"BACKEND": "triton"}), &bytes.Buffer{})
	if err != nil || cfg.Backend != live.BackendTriton {
		t.Fatalf("BACKEND=triton: backend %q, err %v", cfg.Backend, err)
	}
	cfg, err = parseRun([]string{"--backend", "sim", "--task-types", "a,b"}, env(map[string]string{"BACKEND": "triton"}), &bytes.Buffer{})
	if err != nil || cfg.Backend != live.BackendSim || !slices.Equal(cfg.TaskTypes, []string{"a", "b"}) {
		t.Fatalf("--backend sim over BACKEND: %+v, %v", cfg.Backend, err)
	}
	if _, err := parseRun([]string{"--backend", "gpu"}, env(nil), &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "--backend") {
		t.Fatalf("--backend gpu: err %v", err)
	}
}

// batch-compare's own flags (--orders, --concurrency, --input) are checked before
// anything is built or started, and refused as bad usage (2). They used to be checked
// once a fleet ran: --orders label,bogus failed (1) only after the whole label job.
func TestBatchCompareValidatesBeforeStarting(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	in := filepath.Join(dir, "in.jsonl")
	if err := os.WriteFile(in, []byte(`{"label":"l","task_type":"t"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	stubs := stubBinDir(t) // binaries that exit 1: reaching the start step fails with 1
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--input", in, "--orders", "label,bogus"}, `Order must be "label" or "file", got "bogus"`},
		{[]string{"--input", in, "--concurrency", "-1"}, "Concurrency must be positive, got -1"},
		{[]string{"--input", in, "--lookahead", "20", "--max-out-of-order", "10"}, "Lookahead (20) must not exceed MaxOutOfOrder (10)"},
		{[]string{"--input", filepath.Join(dir, "missing.jsonl")}, "--input: stat " + filepath.Join(dir, "missing.jsonl")},
		{[]string{"--input", dir}, "is a directory"},
		{nil, "--input is required"},
		{[]string{"--input", in, "--num-workers", "0"}, "--num-workers"},
		// An empty entry read as batch's default order ran label twice.
		{[]string{"--input", in, "--orders", "label,"}, "--orders"},
		{[]string{"--input", in, "--orders", "file,file"}, "--orders"},
	}
	for _, tt := range tests {
		var out, errb bytes.Buffer
		args := append([]string{"batch-compare", "--quiet", "--bin-dir", stubs}, tt.args...)
		code := run(t.Context(), args, env(nil), &out, &errb)
		if code != 2 || !strings.Contains(errb.String(), tt.want) {
			t.Errorf("%q: exit %d, stderr %q; want exit 2 naming %q", tt.args, code, errb.String(), tt.want)
		}
	}
	// A problem shared by both orders is told once.
	var errb bytes.Buffer
	run(t.Context(), []string{"batch-compare", "--quiet", "--bin-dir", stubs, "--input", in, "--concurrency", "-1"}, env(nil), &bytes.Buffer{}, &errb)
	if n := strings.Count(errb.String(), "Concurrency"); n != 1 {
		t.Errorf("stderr names Concurrency %d times, want once: %q", n, errb.String())
	}
}

// The command promises exit 2 for bad usage, refused before anything starts. A
// --bin-dir that is not there or lacks a binary, and a --repo that is not the
// repository's root, are such mistakes: they used to pass for failed runs (exit 1),
// found only once the run reached them.
func TestRunRefusesABadBinarySource(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	lacking := t.TempDir() // the sim backend's binaries, but not fake-triton
	stubs := stubBinDir(t)
	all := []string{"run", "soak", "batch-compare"}
	for _, name := range []string{"dispatcher", "worker-agent", "log-collector"} {
		b, err := os.ReadFile(filepath.Join(stubs, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(lacking, name), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		cmds []string
		args []string
		want string
	}{
		{all, []string{"--bin-dir", filepath.Join(dir, "nope")}, "--bin-dir: stat " + filepath.Join(dir, "nope")},
		{all, []string{"--bin-dir", t.TempDir()}, "worker-agent"},
		{[]string{"run"}, []string{"--bin-dir", lacking, "--backend", "triton"}, "fake-triton"},
		{all, []string{"--repo", t.TempDir()}, "--repo"},
	}
	for _, tt := range tests {
		for _, cmd := range tt.cmds {
			out := filepath.Join(dir, "out") // must not even be created
			args := append([]string{cmd, "--quiet", "--out", out}, tt.args...)
			if cmd == "batch-compare" {
				in := filepath.Join(dir, "in.jsonl")
				if err := os.WriteFile(in, []byte(`{"label":"l","task_type":"t"}`+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				args = append(args, "--input", in)
			}
			var stdout, stderr bytes.Buffer
			code := run(t.Context(), args, env(nil), &stdout, &stderr)
			if code != 2 || !strings.Contains(stderr.String(), tt.want) {
				t.Errorf("%q: exit %d, stderr %q; want exit 2 naming %q", args, code, stderr.String(), tt.want)
			}
			if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%q: --out %s exists after a refusal (%v): something started", args, out, err)
			}
		}
	}
}

// Without --repo the repository is the one holding the working directory; run from
// elsewhere, that is bad usage too. Not parallel: it changes the working directory.
func TestRunOutsideTheRepositoryIsUsageError(t *testing.T) {
	t.Chdir(t.TempDir())
	var stdout, stderr bytes.Buffer
	if code := run(t.Context(), []string{"run", "--quiet"}, env(nil), &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), "pass --repo") {
		t.Errorf("exit %d, stderr %q; want exit 2 pointing at --repo", code, stderr.String())
	}
}

// A run that fails (here: the binaries exit at once; a Ctrl-C, a build error or a
// worker that never connects do the same) must leave the previous --chart as it was:
// it used to be truncated before measuring and removed on the failure.
func TestFailedRunKeepsTheChart(t *testing.T) {
	t.Parallel()
	if runtime.GOOS == "windows" {
		t.Skip("the stub binaries are shell scripts")
	}
	dir := t.TempDir()
	chart := filepath.Join(dir, "results.svg")
	const old = "<svg>previous run</svg>\n"
	if err := os.WriteFile(chart, []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := run(t.Context(), []string{"run", "--compare", "--quiet", "--chart", chart, "--bin-dir", stubBinDir(t),
		"--out", t.TempDir()}, env(nil), &stdout, &stderr)
	if code != 1 {
		t.Fatalf("exit %d, want 1 (run failed); stderr: %s", code, stderr.String())
	}
	if b, err := os.ReadFile(chart); err != nil || string(b) != old {
		t.Errorf("previous chart after a failed run: %q, err %v; want it untouched\nstderr: %s", b, err, stderr.String())
	}
	// Nor is the temporary file the new chart was to be written to left behind.
	if entries, err := os.ReadDir(dir); err != nil || len(entries) != 1 {
		t.Errorf("chart directory holds %v (%v), want only the chart", entries, err)
	}
	// A --chart that names a directory is refused before anything starts.
	stderr.Reset()
	if code := run(t.Context(), []string{"run", "--compare", "--quiet", "--chart", dir, "--bin-dir", stubBinDir(t)}, env(nil), &stdout, &stderr); code != 2 ||
		!strings.Contains(stderr.String(), "--chart: "+dir+" is not a regular file") {
		t.Errorf("--chart naming a directory: exit %d, stderr %q; want 2", code, stderr.String())
	}
}

// Each command's help promises only what the command does: soak and batch-compare read
// no NUM_WORKERS and have no --backend, though they share run's fleet flags.
func TestHelpNamesOnlyWhatEachCommandReads(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cmd   string
		extra bool // NUM_WORKERS and fake-triton in the help
	}{{"run", true}, {"soak", false}, {"batch-compare", false}} {
		var out, errb bytes.Buffer
		if code := run(t.Context(), []string{tc.cmd, "-h"}, env(nil), &out, &errb); code != 0 {
			t.Fatalf("%s -h: exit %d", tc.cmd, code)
		}
		help := out.String() + errb.String()
		for _, s := range []string{"env NUM_WORKERS", "fake-triton"} {
			if strings.Contains(help, s) != tc.extra {
				t.Errorf("%s -h names %q: %v, want %v\n%s", tc.cmd, s, !tc.extra, tc.extra, help)
			}
		}
	}
}
