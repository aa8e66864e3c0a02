package triton_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/smartroute/smartroute/worker-agent/backend"
	"github.com/smartroute/smartroute/worker-agent/backend/triton"
	"github.com/smartroute/smartroute/worker-agent/backend/triton/fake"
)

// A Load whose last caller gives up (context cancelled, not timed out) leaves Triton
// loading the model, as TRITON.md says Triton's load goes on. The next Load of that
// model must not send a second load request while the first is still LOADING:
// "two concurrent loads of the same model have loaded it twice".
func TestCancelledLoadDoesNotOverlapTheNextLoad(t *testing.T) {
	t.Parallel()
	x := setup(t, fake.Config{Models: []string{"m"}}, nil)
	events := x.fake.Subscribe()
	release := x.fake.HoldLoads("m")
	defer release()
	ctx, cancel := context.WithCancel(t.Context())
	first := make(chan error, 1)
	go func() { first <- x.b.Load(ctx, "m") }()
	await(t, events, "load_start m")
	cancel()
	if err := errorOf(t, first); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Load = %v", err)
	}
	second := make(chan error, 1)
	go func() { second <- x.b.Load(t.Context(), "m") }()
	// Give a wrongly overlapping load request time to reach Triton.
	select {
	case ev := <-events:
		if ev == "load_start m" {
			t.Log("second load started while the first was still LOADING")
		}
	case <-time.After(300 * time.Millisecond):
	}
	release()
	if err := errorOf(t, second); err != nil {
		t.Fatal(err)
	}
	if c := x.fake.MaxConcurrentLoads("m"); c != 1 {
		t.Fatalf("%d load requests for m under way at once, want 1 (Triton loaded it twice)", c)
	}
	if got := x.fake.State("m"); got != fake.StateReady {
		t.Fatalf("state %q after the second Load, want READY", got)
	}
}

// An infer answer is read into memory whatever its size: one far larger than any
// result the agent can send (a frame is 16 MiB by default) is still buffered in full,
// and one that never ends is read until the task's context ends, growing the agent's
// memory all the while. Here Triton answers 200 and then streams more than the agent
// could ever use; Run must give up on its own with an error saying so.
//
// The bound is set small: streaming past the default 32 MiB took seconds under -race.
// The default is checked to be a bound too.
func TestInferAnswerReadIsBounded(t *testing.T) {
	t.Parallel()
	if got := (triton.Config{}).WithDefaults().MaxAnswerSize; got != triton.DefaultMaxAnswerSize || got <= 0 {
		t.Fatalf("default MaxAnswerSize %d, want %d", got, triton.DefaultMaxAnswerSize)
	}
	const limit = 64 << 10
	const sent = 4 * limit
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		chunk := bytes.Repeat([]byte("0,"), 8<<10) // 16 KiB
		_, _ = w.Write([]byte(`{"outputs":[{"name":"y","datatype":"FP32","shape":[1],"data":[`))
		for n := 0; n < sent; n += len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
		<-r.Context().Done() // and then nothing more, as a stuck server
	}))
	defer srv.Close()
	b, err := triton.New(triton.Config{URL: srv.URL, MaxAnswerSize: limit})
	if err != nil {
		t.Fatal(err)
	}
	defer b.CloseIdleConnections()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := b.Run(ctx, backend.Task{Type: triton.TaskInfer, Label: "m",
			Params: []byte(`{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1]}]}`)})
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "larger than") {
			t.Fatalf("Run = %v, want an error saying the answer is too large", err)
		}
	case <-time.After(waitLimit):
		cancel()
		<-done
		t.Fatalf("Run still reading a %d KiB answer after %s (MaxAnswerSize %d KiB)", sent>>10, waitLimit, limit>>10)
	}
}

// Triton's load call blocks for as long as the load takes (minutes for a large
// model); a connection dropped before the answer (a proxy's idle timeout, a reset)
// makes Load fail while Triton goes on and loads the model. The backend then holds a
// model nobody counts: the agent has recorded the label as not loaded.
func TestLoadWithoutAnAnswerLeavesNothingLoaded(t *testing.T) {
	t.Parallel()
	f := fake.New(fake.Config{Models: []string{"m"}})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/load") {
			f.ServeHTTP(w, r)
			return
		}
		f.ServeHTTP(httptest.NewRecorder(), r) // Triton loads the model...
		if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
			_ = conn.Close() // ...but its answer never arrives
		}
	}))
	defer func() { f.Close(); srv.Close() }()
	b, err := triton.New(triton.Config{URL: srv.URL, PollInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer b.CloseIdleConnections()
	err = b.Load(t.Context(), "m")
	if err == nil {
		t.Fatal("Load succeeded without an answer")
	}
	if got := f.Loaded(); len(got) > 0 {
		t.Fatalf("Load = %v, yet Triton holds %q", err, got)
	}
}
