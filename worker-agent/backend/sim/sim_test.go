package sim_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/smartroute/smartroute/worker-agent/backend"
	"github.com/smartroute/smartroute/worker-agent/backend/sim"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorder is an injected Sleep that records the durations asked for and returns at once.
type recorder struct {
	mu sync.Mutex
	ds []time.Duration
}

func (r *recorder) sleep(ctx context.Context, d time.Duration) error {
	r.mu.Lock()
	r.ds = append(r.ds, d)
	r.mu.Unlock()
	return ctx.Err()
}

func durations(t *testing.T, seed int64) []time.Duration {
	t.Helper()
	rec := &recorder{}
	b, err := sim.New(sim.Config{
		LoadTime: 400 * time.Millisecond, LoadJitter: 100 * time.Millisecond,
		RunTime: 40 * time.Millisecond, RunJitter: 20 * time.Millisecond,
		Seed: seed, Sleep: rec.sleep,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	for i := range 5 {
		if err := b.Load(ctx, "label-a"); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Run(ctx, backend.Task{ID: "t", Label: "label-a"}); err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
	}
	for i, d := range rec.ds {
		base, jitter := 400*time.Millisecond, 100*time.Millisecond
		if i%2 == 1 {
			base, jitter = 40*time.Millisecond, 20*time.Millisecond
		}
		if d < base-jitter || d > base+jitter {
			t.Errorf("duration %d = %s, want %s ± %s", i, d, base, jitter)
		}
	}
	return rec.ds
}

func TestDurationsAreReproducibleForASeed(t *testing.T) {
	t.Parallel()
	a, b, other := durations(t, 7), durations(t, 7), durations(t, 8)
	if len(a) != 10 {
		t.Fatalf("got %d sleeps, want 10", len(a))
	}
	same := true
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("seed 7 gave %v then %v", a, b)
		}
		same = same && a[i] == other[i]
	}
	if same {
		t.Errorf("seeds 7 and 8 gave the same durations %v", a)
	}
}

func TestZeroDurationsNeverSleep(t *testing.T) {
	t.Parallel()
	b, err := sim.New(sim.Config{Sleep: func(context.Context, time.Duration) error {
		t.Error("sleep called for a zero duration")
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Load(t.Context(), "l"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Run(t.Context(), backend.Task{Label: "l"}); err != nil {
		t.Fatal(err)
	}
}

func TestJitterNeverGoesBelowZero(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	b, err := sim.New(sim.Config{LoadTime: time.Millisecond, LoadJitter: time.Second, Seed: 3, Sleep: rec.sleep})
	if err != nil {
		t.Fatal(err)
	}
	for range 50 {
		if err := b.Load(t.Context(), "l"); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range rec.ds {
		if d <= 0 {
			t.Fatalf("slept %s", d)
		}
	}
}

func TestCancellationInterruptsASleep(t *testing.T) {
	t.Parallel()
	b, err := sim.New(sim.Config{LoadTime: time.Hour, RunTime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- b.Load(ctx, "l") }()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Load = %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Load did not return after cancel")
	}
	if b.Loaded("l") {
		t.Error("a cancelled load left the label loaded")
	}
}

func TestRunEchoesTheTask(t *testing.T) {
	t.Parallel()
	b, err := sim.New(sim.Config{WorkerID: "w1"})
	if err != nil {
		t.Fatal(err)
	}
	task := backend.Task{ID: "t1", Attempt: 1, Type: "embed_texts", Label: "m1", Params: []byte(`{"texts":["a"]}`)}
	if _, err := b.Run(t.Context(), task); !errors.Is(err, backend.ErrNotLoaded) {
		t.Fatalf("Run before Load = %v, want ErrNotLoaded", err)
	}
	if err := b.Load(t.Context(), "m1"); err != nil {
		t.Fatal(err)
	}
	out, err := b.Run(t.Context(), task)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]string
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("result %s: %v", out, err)
	}
	want := map[string]string{"task_id": "t1", "task_type": "embed_texts", "label": "m1", "worker_id": "w1", "parameters_json": `{"texts":["a"]}`}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q (result %s)", k, got[k], v, out)
		}
	}
	if err := b.Unload(t.Context(), "m1"); err != nil {
		t.Fatal(err)
	}
	if b.Loaded("m1") {
		t.Error("label still loaded after Unload")
	}
}

func TestNegativeDurationsAreRefused(t *testing.T) {
	t.Parallel()
	_, err := sim.New(sim.Config{RunJitter: -time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "RunJitter") {
		t.Fatalf("New = %v, want an error naming RunJitter", err)
	}
}

// A jitter above MaxInt64/2 overflowed 2*jitter+1, and the first load panicked in
// rand.Int64N; anything over a day is refused instead.
func TestHugeDurationsAreRefused(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]sim.Config{
		"LoadJitter": {LoadJitter: 1300000 * time.Hour},
		"RunTime":    {RunTime: sim.MaxDuration + 1},
	} {
		if _, err := sim.New(cfg); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("New(%+v) = %v, want an error naming %s", cfg, err, name)
		}
	}
	if _, err := sim.New(sim.Config{LoadTime: sim.MaxDuration, LoadJitter: sim.MaxDuration}); err != nil {
		t.Errorf("New at MaxDuration: %v", err)
	}
}
