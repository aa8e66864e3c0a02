package triton_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/smartroute/smartroute/worker-agent/backend"
	"github.com/smartroute/smartroute/worker-agent/backend/triton"
	"github.com/smartroute/smartroute/worker-agent/backend/triton/fake"
)

// connRequests counts the requests served on one connection.
type connRequests struct{}

// dropReused serves f but closes a keep-alive connection, unanswered, when a second
// request arrives on it. That is what the client sees when Triton or a proxy closed
// an idle keep-alive connection just as the client reused it: the write succeeds and
// the read finds the connection gone. Dropping at the second request, rather than
// closing after the first answer and hoping the client has not noticed yet, makes it
// happen every time. dropped lists the requests dropped, as "METHOD path".
func dropReused(t *testing.T, f *fake.Server) (srv *httptest.Server, dropped func() []string) {
	t.Helper()
	var (
		mu   sync.Mutex
		drop []string
	)
	srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := r.Header["Idempotency-Key"]; ok {
			t.Errorf("%s %s carries an Idempotency-Key header; the mark is for the transport only", r.Method, r.URL.Path)
		}
		if r.Context().Value(connRequests{}).(*atomic.Int32).Add(1) == 1 {
			f.ServeHTTP(w, r)
			return
		}
		mu.Lock()
		drop = append(drop, r.Method+" "+r.URL.Path)
		mu.Unlock()
		conn, _, err := w.(http.Hijacker).Hijack()
		if err != nil {
			t.Errorf("hijack: %v", err)
			return
		}
		_ = conn.Close()
	}))
	srv.Config.ConnContext = func(ctx context.Context, _ net.Conn) context.Context {
		return context.WithValue(ctx, connRequests{}, new(atomic.Int32))
	}
	srv.Start()
	t.Cleanup(func() {
		f.Close()
		srv.Close()
	})
	return srv, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(drop)
	}
}

// The first request on a keep-alive connection that Triton (or a proxy) has closed
// fails before any answer. Go's transport sends such a request again on a new
// connection only when it is idempotent, and Triton's calls are POSTs: every such
// failure was a task error or a failed load. Reads (infer, the index) and unloads
// (a no-op when repeated, TRITON.md) may be sent again; a load must not be, since a
// second load of a model still loading loads it twice.
func TestDeadKeepAliveConnectionIsNoFailure(t *testing.T) {
	t.Parallel()
	f := fake.New(fake.Config{Models: []string{"m"}, Dim: 2})
	srv, dropped := dropReused(t, f)
	b, err := triton.New(triton.Config{URL: srv.URL, PollInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer b.CloseIdleConnections()
	ctx := t.Context()

	if err := b.WaitStarted(ctx); err != nil {
		t.Fatalf("WaitStarted: %v", err)
	}
	if _, err := b.Inventory(ctx); err != nil {
		t.Fatalf("Inventory: %v", err)
	}
	if err := b.Load(ctx, "m"); err != nil {
		t.Fatalf("Load: %v", err)
	}
	for _, task := range []backend.Task{
		{Type: triton.TaskInfer, Label: "m", Params: params},
		{Type: triton.TaskEmbedTexts, Label: "m", Params: []byte(`{"texts":["a","b"]}`)},
	} {
		if _, err := b.Run(ctx, task); err != nil {
			t.Fatalf("Run %s: %v", task.Type, err)
		}
	}
	if err := b.Health(ctx); err != nil {
		t.Fatalf("Health: %v", err)
	}
	if err := b.Unload(ctx, "m"); err != nil {
		t.Fatalf("Unload: %v", err)
	}
	got := dropped()
	t.Logf("dropped: %q", got)
	if len(got) < 4 {
		t.Fatalf("only %d requests met a dropped connection; the test tests nothing", len(got))
	}
	if n, c := f.LoadRequests("m"), f.MaxConcurrentLoads("m"); n != 1 || c != 1 {
		t.Fatalf("%d load requests, %d at once; want 1, 1", n, c)
	}
	// An inference that carries a sequence's state is not a plain read: sent twice, it
	// advances the sequence twice. It fails rather than be sent again.
	seq := []byte(`{"parameters":{"sequence_id":7},"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1]}]}`)
	if err := b.Load(ctx, "m"); err != nil {
		t.Fatalf("Load: %v", err)
	}
	before := len(dropped())
	if _, err := b.Run(ctx, backend.Task{Type: triton.TaskInfer, Label: "m", Params: seq}); err == nil || len(dropped()) != before+1 {
		t.Fatalf("sequence inference on a dropped connection: Run = %v after %d drops, want an error after 1 (never sent again)", err, len(dropped())-before)
	}
}

// The backend's client keeps as many idle connections as calls run at once, so that
// the next burst reuses them. A clone of http.DefaultTransport keeps 2 per host: an
// agent running more tasks at once closed the rest after every burst and dialled anew
// for the next, a handshake per inference and TIME_WAIT sockets piling up.
func TestIdleConnectionsCoverConcurrentCalls(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name         string
		maxIdleConns int // 0: the default
		calls        int
	}{
		{"default", 0, 8},
		{"configured", 24, 24},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := tc.calls
			f := fake.New(fake.Config{Models: []string{"m"}, Preload: []string{"m"}, Dim: 2})
			var newConns atomic.Int32
			arrived := make(chan struct{}, n)
			var gate atomic.Pointer[chan struct{}]
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				arrived <- struct{}{}
				<-*gate.Load() // every call of the round is in flight at once
				f.ServeHTTP(w, r)
			}))
			srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
				if s == http.StateNew {
					newConns.Add(1)
				}
			}
			srv.Start()
			t.Cleanup(func() { f.Close(); srv.Close() })
			b, err := triton.New(triton.Config{URL: srv.URL, MaxIdleConns: tc.maxIdleConns})
			if err != nil {
				t.Fatal(err)
			}
			defer b.CloseIdleConnections()

			// round runs n inferences held in flight at once and returns how many
			// connections it opened. With sequential, each starts only once the one
			// before it reached the server, so that it takes an idle connection rather
			// than dial while another is being returned.
			round := func(sequential bool) int32 {
				before := newConns.Load()
				g := make(chan struct{})
				gate.Store(&g)
				errs := make(chan error, n)
				for range n {
					go func() {
						_, err := b.Run(t.Context(), backend.Task{Type: triton.TaskInfer, Label: "m", Params: params})
						errs <- err
					}()
					if sequential {
						<-arrived
					}
				}
				if !sequential {
					for range n {
						<-arrived
					}
				}
				close(g)
				for range n {
					if err := <-errs; err != nil {
						t.Error(err)
					}
				}
				return newConns.Load() - before
			}
			first := round(false)
			if second := round(true); second != 0 {
				t.Fatalf("round 1 of %d concurrent inferences opened %d connections; round 2 opened %d more: fewer were kept idle", n, first, second)
			}
		})
	}
}
