package live

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeOps is a dispatcher's ops API that becomes healthy after unhealthy probes
// and lists one more worker on each /workers call.
type fakeOps struct {
	unhealthy int

	mu      sync.Mutex
	probes  int
	workers []string
}

func (f *fakeOps) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch r.URL.Path {
	case "/health":
		f.probes++
		if f.probes <= f.unhealthy {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		json.NewEncoder(w).Encode(map[string]string{"message": "OK"})
	case "/workers":
		json.NewEncoder(w).Encode(map[string][]string{"workers": f.workers})
		f.workers = append(f.workers, agentID(len(f.workers)+1))
	}
}

func TestReadinessChecks(t *testing.T) {
	t.Parallel()
	ops := &fakeOps{unhealthy: 2}
	srv := httptest.NewServer(ops)
	t.Cleanup(srv.Close)
	client := srv.Client()

	err := waitUntil(t.Context(), time.Minute, nil, func(ctx context.Context) error { return checkHealth(ctx, client, srv.URL) })
	if err != nil {
		t.Fatal(err)
	}
	if ops.probes != 3 {
		t.Errorf("%d health probes, want 3", ops.probes)
	}
	want := []string{agentID(1), agentID(2), agentID(3)}
	if err := waitUntil(t.Context(), time.Minute, nil, func(ctx context.Context) error { return checkWorkers(ctx, client, srv.URL, want) }); err != nil {
		t.Fatal(err)
	}
}

func TestReadinessTimeout(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(map[string]string{"message": "starting"})
	}))
	t.Cleanup(srv.Close)
	// Long enough for at least one check to answer on a loaded machine: the error must
	// carry the last answer.
	err := waitUntil(t.Context(), 500*time.Millisecond, nil, func(ctx context.Context) error { return checkHealth(ctx, srv.Client(), srv.URL) })
	if err == nil || !strings.Contains(err.Error(), "not ready after 500ms") || !strings.Contains(err.Error(), `message "starting"`) {
		t.Errorf("err = %v", err)
	}
}
