package agent_test

import (
	"context"
	"errors"
	"flag"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/smartroute/smartroute/proto/frame"
	pb "github.com/smartroute/smartroute/proto/smartroutev1"
	"github.com/smartroute/smartroute/worker-agent/agent"
)

func TestWithDefaults(t *testing.T) {
	t.Parallel()
	c := agent.Config{}.WithDefaults()
	if c.DispatcherURL != agent.DefaultDispatcherURL || c.MaxLabels != 2 || c.Slots != 1 || c.BackendName != "sim" ||
		c.LogLevel != "info" || c.DrainTimeout != 30*time.Second || c.MaxFrameSize != frame.DefaultMaxSize {
		t.Errorf("defaults %+v", c)
	}
	if c.WorkerID == "" || c.Sim.WorkerID != c.WorkerID {
		t.Errorf("worker id %q, sim worker id %q", c.WorkerID, c.Sim.WorkerID)
	}
	// Zero sim durations stay zero: they mean instant.
	if c.Sim.LoadTime != 0 || c.Sim.RunTime != 0 {
		t.Errorf("sim durations %s and %s, want 0", c.Sim.LoadTime, c.Sim.RunTime)
	}
	if other := (agent.Config{}).WithDefaults(); other.WorkerID == c.WorkerID {
		t.Errorf("two default worker ids are both %q", c.WorkerID)
	}
}

func TestInvalidConfigNamesTheField(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		field string
		set   func(*agent.Config)
	}{
		{"DispatcherURL", func(c *agent.Config) { c.DispatcherURL = "http://x/worker-listen" }},
		{"WorkerID", func(c *agent.Config) { c.WorkerID = "a b" }},
		// Ids the dispatcher refuses (400 on every dial, retried for ever): over 256
		// bytes, or anything but visible ASCII.
		{"WorkerID", func(c *agent.Config) { c.WorkerID = strings.Repeat("w", 257) }},
		{"WorkerID", func(c *agent.Config) { c.WorkerID = "wörker-1" }},
		{"WorkerID", func(c *agent.Config) { c.WorkerID = "worker\x01" }},
		{"WorkerID", func(c *agent.Config) { c.WorkerID = "worker\x7f" }},
		{"MaxLabels", func(c *agent.Config) { c.MaxLabels = -1 }},
		{"Slots", func(c *agent.Config) { c.Slots = -2 }},
		// The hello carries them as uint32: 1<<32 slots said hello with 0.
		{"Slots", func(c *agent.Config) { c.Slots = 1 << 32 }},
		{"MaxLabels", func(c *agent.Config) { c.MaxLabels = 1<<32 + 2 }},
		{"Slots", func(c *agent.Config) { c.Slots = agent.MaxCapacity + 1 }},
		{"MaxLabels", func(c *agent.Config) { c.MaxLabels = agent.MaxCapacity + 1 }},
		// 2*jitter+1 overflowed and the first load panicked.
		{"Sim.LoadJitter", func(c *agent.Config) { c.Sim.LoadJitter = 1300000 * time.Hour }},
		{"Sim.RunTime", func(c *agent.Config) { c.Sim.RunTime = 25 * time.Hour }},
		{"BackendName", func(c *agent.Config) { c.BackendName = "tpu" }},
		{"Triton.URL", func(c *agent.Config) { c.BackendName = "triton"; c.Triton.URL = "ftp://x" }},
		{"Triton.LoadTimeout", func(c *agent.Config) { c.BackendName = "triton"; c.Triton.LoadTimeout = -time.Second }},
		{"LogLevel", func(c *agent.Config) { c.LogLevel = "loud" }},
		{"Labels[1]", func(c *agent.Config) { c.Labels = []string{"a", ""} }},
		{"DrainTimeout", func(c *agent.Config) { c.DrainTimeout = -time.Second }},
		{"Sim.RunJitter", func(c *agent.Config) { c.Sim.RunJitter = -time.Second }},
		{"PingInterval", func(c *agent.Config) { c.PingInterval = time.Minute; c.ReadTimeout = time.Second }},
		{"WorkerToken", func(c *agent.Config) { c.WorkerToken = "two words" }},
		{"CAFile", func(c *agent.Config) { c.CAFile = "/nonexistent/ca.pem" }},
		{"CAFile", func(c *agent.Config) { c.CAFile = "config_test.go" }}, // not PEM
		{"Pprof", func(c *agent.Config) { c.Pprof = true }},
	} {
		t.Run(tc.field, func(t *testing.T) {
			t.Parallel()
			c := agent.Config{LogOutput: io.Discard}
			tc.set(&c)
			err := agent.Run(t.Context(), c)
			if err == nil || !strings.Contains(err.Error(), tc.field) {
				t.Errorf("Run = %v, want an error naming %s", err, tc.field)
			}
		})
	}
}

// resultOverhead (4 KiB) of each result frame is kept for the result's other fields: a
// MaxFrameSize at or near it left no room for any result, and every task failed with
// "does not fit in a frame". It is refused at start; the smallest allowed one works.
func TestMaxFrameSizeLeavesRoomForAResult(t *testing.T) {
	t.Parallel()
	for _, size := range []int{1024, 4096, agent.MinMaxFrameSize - 1} {
		ctx, cancel := context.WithCancel(t.Context())
		cancel() // a config taken would stop at once, without an error
		err := agent.Run(ctx, agent.Config{LogOutput: io.Discard, MaxFrameSize: size})
		if !errors.Is(err, agent.ErrConfig) || !strings.Contains(err.Error(), "MaxFrameSize must be at least") {
			t.Errorf("Run with MaxFrameSize %d = %v, want agent.ErrConfig naming MaxFrameSize", size, err)
		}
	}
	h := setup(t, withConfig(func(c *agent.Config) { c.MaxFrameSize = agent.MinMaxFrameSize }))
	p := h.connect()
	if r := p.run("t1", "a", ""); !r.GetOk() {
		t.Fatalf("result %v with MaxFrameSize %d, want ok", r, agent.MinMaxFrameSize)
	}
	if err := h.stop(p); err != nil {
		t.Fatalf("Run = %v", err)
	}
}

// A dispatcher whose frame limit (from its Welcome) is below the agent's gets a
// result too large for it as the task's error, not as a frame that closes the
// connection (1009) and brings the task back to fail the same way elsewhere.
func TestResultsKeepWithinTheDispatchersFrameLimit(t *testing.T) {
	t.Parallel()
	h := setup(t)
	p := h.connectWith(&pb.Welcome{ProtocolVersion: frame.ProtocolVersion, DispatcherId: "small", MaxFrameBytes: 16 << 10})
	big := []byte(`{"data":"` + strings.Repeat("x", 20<<10) + `"}`) // echoed into the result
	p.assign(&pb.TaskAssignment{TaskId: "big", TaskType: "sample_task", Label: "a", ParametersJson: big})
	if r := p.result(); r.GetOk() || !strings.Contains(r.GetError(), "does not fit in a frame (results up to 12288 bytes: the frame limit 16384 less 4096") {
		t.Fatalf("result ok=%v error %q, want the 16 KiB limit's error", r.GetOk(), r.GetError())
	}
	if r := p.run("small", "a", ""); !r.GetOk() { // the connection goes on
		t.Fatalf("next result %v, want ok", r)
	}
	if err := h.stop(p); err != nil {
		t.Fatalf("Run = %v", err)
	}
}

func TestConfigFromArgs(t *testing.T) {
	t.Parallel()
	env := map[string]string{
		"DISPATCHER_URL": "ws://dispatcher:8080/worker-listen",
		"SLOTS":          "4",
		"MAX_LABELS":     "3",
		"SIM_RUN_TIME":   "5ms",
		"LABELS":         "a, b,,c",
		"WORKER_TOKEN":   "tok-1",
		"CA_FILE":        "/etc/ca.pem",
		"METRICS_ADDR":   ":9100",
		"PPROF":          "true",
	}
	c, err := agent.ConfigFromArgs([]string{"--slots", "2", "--seed=9", "--sim-load-jitter", "10ms"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.DispatcherURL != env["DISPATCHER_URL"] || c.MaxLabels != 3 || c.Sim.RunTime != 5*time.Millisecond {
		t.Errorf("environment not applied: %+v", c)
	}
	if c.Slots != 2 || c.Sim.Seed != 9 || c.Sim.LoadJitter != 10*time.Millisecond {
		t.Errorf("flags not applied or lost to the environment: %+v", c)
	}
	if c.Sim.LoadTime != agent.DefaultSimLoadTime || c.BackendName != "sim" || c.DrainTimeout != 30*time.Second {
		t.Errorf("defaults not applied: %+v", c)
	}
	if c.WorkerToken != "tok-1" || c.CAFile != "/etc/ca.pem" {
		t.Errorf("WORKER_TOKEN/CA_FILE not applied: %q %q", c.WorkerToken, c.CAFile)
	}
	if c.MetricsAddr != ":9100" || !c.Pprof {
		t.Errorf("metrics flags from the environment: %q %v", c.MetricsAddr, c.Pprof)
	}
	if !slices.Equal(c.Labels, []string{"a", "b", "c"}) {
		t.Errorf("labels %q", c.Labels)
	}

	_, err = agent.ConfigFromArgs(nil, func(k string) string { return map[string]string{"SLOTS": "many"}[k] }, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "SLOTS") {
		t.Errorf("bad environment value: %v, want an error naming SLOTS", err)
	}
	if _, err := agent.ConfigFromArgs([]string{"-h"}, func(string) string { return "" }, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h gave %v", err)
	}
}

// Zero is Config's "default" for these flags; on the command line or in the
// environment it is refused, not quietly replaced (--slots 0 ran with 1 slot).
func TestZeroThatWouldMeanTheDefaultIsRefused(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want []string
	}{
		{args: []string{"--slots", "0", "--max-labels", "0", "--drain-timeout", "0", "--triton-start-timeout", "0", "--agents", "0"},
			want: []string{"--slots (SLOTS)", "--max-labels (MAX_LABELS)", "--drain-timeout (DRAIN_TIMEOUT)", "--triton-start-timeout", "--agents (AGENTS)"}},
		{env: map[string]string{"SLOTS": "0", "TRITON_LOAD_TIMEOUT": "0s", "AGENTS": "-3"},
			want: []string{"--slots (SLOTS)", "--triton-load-timeout (TRITON_LOAD_TIMEOUT)", "got -3"}},
		{args: []string{"--sim-load-time", "0", "--sim-run-time", "0"}}, // instant there, and allowed
	} {
		_, err := agent.ConfigFromArgs(tc.args, func(k string) string { return tc.env[k] }, io.Discard)
		if len(tc.want) == 0 {
			if err != nil {
				t.Errorf("args %q: %v", tc.args, err)
			}
			continue
		}
		for _, w := range tc.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("args %q env %v: error %v, want it to name %s", tc.args, tc.env, err, w)
			}
		}
	}
}

// --agents N with the Triton backend would point N agents at one Triton, each
// believing it owns it (each adopts the same models, fills MaxLabels of its own, and
// unloads models the others run tasks on): refused as a config error before anything
// starts, as are a count below one and one injected Backend for many.
func TestRunManyRefusesASharedBackend(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // nothing may start: the config alone must be refused
	for _, tt := range []struct {
		name string
		cfg  agent.Config
		n    int
	}{
		{"triton", agent.Config{BackendName: "triton", LogOutput: io.Discard}, 2},
		{"zero agents", agent.Config{LogOutput: io.Discard}, 0},
	} {
		if err := agent.RunMany(ctx, tt.cfg, tt.n); !errors.Is(err, agent.ErrConfig) {
			t.Errorf("%s: RunMany = %v, want a config error", tt.name, err)
		}
	}
}
