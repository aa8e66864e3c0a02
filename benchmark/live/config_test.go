package live

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/smartroute/smartroute/benchmark/sim"
)

func TestDefaultConfigValid(t *testing.T) {
	t.Parallel()
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestValidateNamesTheFlag(t *testing.T) {
	t.Parallel()
	tmp := t.TempDir() // neither binaries nor go.work
	tests := []struct {
		mutate func(*Config)
		flag   string
	}{
		{func(c *Config) { c.Requests = 0 }, "--requests"},
		{func(c *Config) { c.Producers = -1 }, "--producers"},
		{func(c *Config) { c.NumWorkers = 0 }, "--num-workers (NUM_WORKERS)"},
		{func(c *Config) { c.MaxLabels = 0 }, "--max-labels"},
		{func(c *Config) { c.Slots = 0 }, "--slots"},
		{func(c *Config) { c.Labels = 0 }, "--labels"},
		{func(c *Config) { c.WaitAvg = -time.Second }, "--wait-avg"},
		{func(c *Config) { c.WaitStddev = -time.Second }, "--wait-stddev"},
		{func(c *Config) { c.SimLoadTime = -1 }, "--sim-load-time"},
		{func(c *Config) { c.SimRunJitter = -1 }, "--sim-run-jitter"},
		{func(c *Config) { c.TaskTimeout = -1 }, "--task-timeout"},
		{func(c *Config) { c.RequestTimeout = -1 }, "--request-timeout"},
		{func(c *Config) { c.SyncShare = 1.1 }, "--sync-share"},
		{func(c *Config) { c.SyncShare = math.NaN() }, "--sync-share"},
		{func(c *Config) { c.TimeScale = 0 }, "--time-scale"},
		{func(c *Config) { c.TimeScale = math.Inf(1) }, "--time-scale"},
		{func(c *Config) { c.TimeScale = 1e300 }, "--time-scale 1e+300 makes --wait-avg (1s) too long for a duration"},
		{func(c *Config) { c.TimeScale = 1e-300 }, "--time-scale must be at least 1e-06"},
		{func(c *Config) { c.SimLoadTime, c.TimeScale = time.Duration(math.MaxInt64), 1.5 }, "--sim-load-time"},
		{func(c *Config) { c.Parameters = "notjson" }, `--parameters must be JSON, got "notjson"`},
		{func(c *Config) { c.Backend = "gpu" }, "--backend"},
		{func(c *Config) { c.TaskTypes = []string{"a", ""} }, "--task-types"},
		{func(c *Config) { c.LogLevel = "loud" }, "--log-level"},
		{func(c *Config) { c.ChartPath = "x.svg" }, "--chart needs --compare"},
		{func(c *Config) { c.RepoDir, c.BinDir = "a", "b" }, "--repo and --bin-dir"},
		{func(c *Config) { c.BinDir = filepath.Join(tmp, "nope") }, "--bin-dir: stat"},
		{func(c *Config) { c.BinDir = tmp }, "--bin-dir: stat " + filepath.Join(tmp, "dispatcher")},
		{func(c *Config) { c.RepoDir = tmp }, "--repo " + tmp + ": not the repository's root"},
	}
	for _, tt := range tests {
		c := DefaultConfig()
		tt.mutate(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tt.flag) {
			t.Errorf("err = %v, want one naming %s", err, tt.flag)
		}
	}
	// All problems at once, one per line.
	c := DefaultConfig()
	c.Requests, c.Labels = 0, 0
	if err := c.Validate(); err == nil || strings.Count(err.Error(), "\n") != 1 {
		t.Errorf("err = %v, want two lines", err)
	}
}

func TestAgentArgsScaled(t *testing.T) {
	t.Parallel()
	c := DefaultConfig()
	c.TimeScale = 0.1
	c.Seed = 5
	c.MaxLabels = 3
	got := agentArgs(c, "127.0.0.1:9", 2, "")
	want := []string{
		"--dispatcher-url", "ws://127.0.0.1:9/worker-listen",
		"--worker-id", "bench-worker-2",
		"--max-labels", "3",
		"--slots", "1",
		"--log-level", "info",
		"--backend", "sim",
		"--sim-load-time", "40ms",
		"--sim-load-jitter", "5ms",
		"--sim-run-time", "5ms",
		"--sim-run-jitter", "1ms",
		"--seed", "7",
	}
	if !slices.Equal(got, want) {
		t.Errorf("agentArgs =\n%q\nwant\n%q", got, want)
	}
}

// With --backend triton each agent is pointed at its own fake Triton, whose models
// are the benchmark's labels and whose loads take the scaled load time; producers
// send infer tasks the fake can run.
func TestTritonBackendArgs(t *testing.T) {
	t.Parallel()
	c := DefaultConfig()
	c.Backend = BackendTriton
	c.TimeScale = 0.1
	c = c.withDefaults()
	got := agentArgs(c, "127.0.0.1:9", 1, "http://127.0.0.1:10")
	if want := []string{"--backend", "triton", "--triton-url", "http://127.0.0.1:10"}; !slices.Equal(got[len(got)-4:], want) {
		t.Errorf("agentArgs = %q, want it to end with %q", got, want)
	}
	if want := []string{"--addr", "127.0.0.1:10", "--models", "label-1,label-2,label-3,label-4", "--load-delay", "40ms", "--unload-delay", "5ms"}; !slices.Equal(fakeTritonArgs(c, "127.0.0.1:10"), want) {
		t.Errorf("fakeTritonArgs = %q, want %q", fakeTritonArgs(c, "127.0.0.1:10"), want)
	}
	if !slices.Equal(c.TaskTypes, []string{"infer"}) || c.Parameters != tritonInferBody {
		t.Errorf("triton defaults: task types %q, parameters %q", c.TaskTypes, c.Parameters)
	}
	if s := DefaultConfig().withDefaults(); !slices.Equal(s.TaskTypes, []string{"sample_task"}) || s.Parameters != "" {
		t.Errorf("sim defaults: task types %q, parameters %q", s.TaskTypes, s.Parameters)
	}
}

func TestDispatcherArgs(t *testing.T) {
	t.Parallel()
	c := DefaultConfig()
	if got, want := dispatcherArgs(c, "127.0.0.1:9", true, "/out", nil), []string{"--addr", "127.0.0.1:9", "--random-dispatch=true", "--log-level", "info", "--data-dir", "/out/dispatcher-data",
		"--load-time-prior", "400ms", "--run-time-prior", "50ms", "--max-pass-over", "2s"}; !slices.Equal(got, want) {
		t.Errorf("dispatcherArgs = %q, want %q", got, want)
	}
	c.TaskTimeout = 90 * time.Second
	c.LogLevel = "warn"
	if got, want := dispatcherArgs(c, "a:1", false, "/out", []string{"--pprof-addr", "x"}), []string{"--addr", "a:1", "--random-dispatch=false", "--log-level", "warn", "--data-dir", "/out/dispatcher-data",
		"--load-time-prior", "400ms", "--run-time-prior", "50ms", "--max-pass-over", "2s", "--task-timeout", "1m30s", "--pprof-addr", "x"}; !slices.Equal(got, want) {
		t.Errorf("dispatcherArgs = %q, want %q", got, want)
	}
}

// The scheduler's own durations are scaled with the workload's: at seed-4's scale the
// dispatcher expects the 20 ms loads it gets, not 400 ms (see dispatcherArgs).
func TestDispatcherArgsScaled(t *testing.T) {
	t.Parallel()
	c := DefaultConfig()
	if err := ApplyScenario(&c, "seed-4"); err != nil {
		t.Fatal(err)
	}
	got := dispatcherArgs(c, "a:1", false, "/out", nil)
	want := []string{"--load-time-prior", "20ms", "--run-time-prior", "2.5ms", "--max-pass-over", "100ms"}
	if !slices.Equal(got[len(got)-len(want):], want) {
		t.Errorf("dispatcherArgs = %q, want it to end with %q", got, want)
	}
	c.TimeScale = MinTimeScale // none rounds to 0, which the dispatcher refuses
	want = []string{"--load-time-prior", "400ns", "--run-time-prior", "50ns", "--max-pass-over", "2µs"}
	if got := dispatcherArgs(c, "a:1", false, "/out", nil); !slices.Equal(got[len(got)-len(want):], want) {
		t.Errorf("dispatcherArgs = %q, want it to end with %q", got, want)
	}
}

func TestAgentLogLevel(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{"": "info", "info": "info", "warn": "info", "error": "info", "debug": "debug", "trace": "debug", "bogus": "info"} {
		if got := agentLogLevel(in); got != want {
			t.Errorf("agentLogLevel(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestChildEnv(t *testing.T) {
	// Not parallel: it sets environment variables.
	t.Setenv("RANDOM_DISPATCH", "true")
	t.Setenv("POLICY", "random")
	t.Setenv("LABELS", "label-9")
	t.Setenv("GOMAXPROCS", "3")
	env := childEnv()
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if !slices.Contains(childEnvKeep, name) {
			t.Errorf("child env holds %s", kv)
		}
	}
	if !slices.Contains(env, "GOMAXPROCS=3") {
		t.Errorf("child env lacks GOMAXPROCS: %q", env)
	}
}

func TestFindRepoRoot(t *testing.T) {
	t.Parallel()
	root, err := FindRepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.work")); err != nil {
		t.Fatalf("root %q: %v", root, err)
	}
	if _, err := FindRepoRoot(t.TempDir()); err == nil || !strings.Contains(err.Error(), "--repo") {
		t.Errorf("err = %v, want one pointing at --repo", err)
	}
}

func TestPrebuiltChecks(t *testing.T) {
	t.Parallel()
	_, err := prebuilt(t.TempDir(), BackendSim)
	if err == nil || !strings.Contains(err.Error(), "--bin-dir") || !strings.Contains(err.Error(), "worker-agent") {
		t.Errorf("err = %v, want both missing binaries named under --bin-dir", err)
	}
}

func TestBuildFailureCarriesOutput(t *testing.T) {
	t.Parallel()
	repo := t.TempDir()
	if err := os.WriteFile(filepath.Join(repo, "go.work"), []byte("go 1.26\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Build(t.Context(), repo, t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "go build ./dispatcher/cmd/dispatcher") || !strings.Contains(err.Error(), "dispatcher") {
		t.Fatalf("err = %v, want the failed command and its output", err)
	}
}

// Each run's directory starts empty: the collector appends to the files it finds and
// the dispatcher reruns the journal it finds (run, soak and batch-compare all use it).
func TestFreshDirEmptiesAReusedDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "soak")
	old := filepath.Join(dir, "dispatcher-data", "journal.db")
	if err := os.MkdirAll(filepath.Dir(old), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(old, []byte("an earlier run"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := freshDir(dir); err != nil {
		t.Fatal(err)
	}
	if entries, err := os.ReadDir(dir); err != nil || len(entries) != 0 {
		t.Fatalf("after freshDir: %v, %v", entries, err)
	}
	if err := freshDir(filepath.Join(dir, "new")); err != nil { // one not there yet
		t.Fatal(err)
	}
}

// The live presets run the simulator's built-in seed scenarios: the same fleet, labels,
// pauses, load and run times (solved from the seed's figures; see Scenarios).
func TestSeedPresetsMatchTheSimulator(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"seed-4", "seed-5"} {
		c := DefaultConfig()
		if err := ApplyScenario(&c, name); err != nil {
			t.Fatal(err)
		}
		sc, ok := sim.Builtin(name)
		if !ok {
			t.Fatalf("no simulator built-in %s", name)
		}
		if c.SimLoadTime != sc.Load.Mean.D() || c.SimRunTime != sc.Run.Mean.D() ||
			c.SimLoadJitter != sc.Load.Stddev.D() || c.SimRunJitter != sc.Run.Stddev.D() ||
			c.Labels != sc.Labels.Count || c.NumWorkers != sc.Workers.Count || c.MaxLabels != sc.Workers.MaxLabels ||
			c.Requests != sc.Tasks || c.Producers != sc.Arrival.Producers ||
			c.WaitAvg != sc.Arrival.WaitAvg.D() || c.WaitStddev != sc.Arrival.WaitStddev.D() {
			t.Errorf("%s: live preset %+v differs from the simulator's %+v", name, c, sc)
		}
	}
}
