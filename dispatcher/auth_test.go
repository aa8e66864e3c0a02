package dispatcher

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gorilla/websocket"
	"github.com/labstack/echo/v4"

	pb "github.com/smartroute/smartroute/proto/smartroutev1"
)

const (
	testWorkerToken = "worker-secret-1"
	testAPIKey      = "producer-key-1"
)

// send makes a request with the given headers and decodes the JSON answer.
func (b *bundle) send(method, path, body string, header ...string) (int, http.Header, map[string]any) {
	b.t.Helper()
	req, err := http.NewRequest(method, b.srv.URL+path, strings.NewReader(body))
	if err != nil {
		b.t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := b.client().Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		b.t.Fatalf("%s %s answered %d with a body that is not JSON: %q", method, path, resp.StatusCode, raw)
	}
	return resp.StatusCode, resp.Header, out
}

// dialWith opens /worker-listen with an Authorization header (none when empty).
func (b *bundle) dialWith(id, authorization string) (*websocket.Conn, *http.Response, error) {
	h := http.Header{}
	h.Set("Worker-Id", id)
	if authorization != "" {
		h.Set("Authorization", authorization)
	}
	ws, resp, err := websocket.DefaultDialer.Dial(b.wsURL(), h)
	if ws != nil {
		b.t.Cleanup(func() { ws.Close() })
	}
	return ws, resp, err
}

// untouched fails the test when the hub knows any worker or task: refused requests
// must never reach it.
func (b *bundle) untouched() {
	b.t.Helper()
	b.d.hub.mu.Lock()
	defer b.d.hub.mu.Unlock()
	if n, q, a := len(b.d.hub.workers), b.d.hub.sched.QueuedTasks(), len(b.d.hub.active); n+q+a != 0 {
		b.t.Fatalf("a refused request reached the hub: %d workers, %d queued, %d active tasks", n, q, a)
	}
}

func TestWorkerListenRefusesBadCredentials(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{WorkerTokens: []string{testWorkerToken}, APIKeys: []string{testAPIKey}})
	for _, tc := range []struct {
		name, authorization string
		status              int
		want                string
	}{
		{"no token", "", 401, "worker token required"},
		{"wrong token", "Bearer not-the-token", 401, "refused"},
		{"not a bearer", "Basic " + testWorkerToken, 401, "worker token required"},
		{"empty bearer", "Bearer ", 401, "worker token required"},
		{"producer key", "Bearer " + testAPIKey, 403, "producer API key"},
	} {
		ws, resp, err := b.dialWith("w-"+strings.ReplaceAll(tc.name, " ", "-"), tc.authorization)
		if err == nil || ws != nil || resp == nil || resp.StatusCode != tc.status {
			t.Fatalf("%s: want the upgrade refused with %d, got err %v resp %v", tc.name, tc.status, err, resp)
		}
		raw, _ := io.ReadAll(resp.Body)
		var body errorBody
		if json.Unmarshal(raw, &body) != nil || !strings.Contains(body.Error, tc.want) {
			t.Fatalf("%s: body %q, want JSON error containing %q", tc.name, raw, tc.want)
		}
		if strings.Contains(string(raw), testWorkerToken) || strings.Contains(string(raw), testAPIKey) {
			t.Fatalf("%s: the answer echoes a secret: %q", tc.name, raw)
		}
		if tc.status == 401 && resp.Header.Get("WWW-Authenticate") == "" {
			t.Fatalf("%s: 401 without a WWW-Authenticate challenge", tc.name)
		}
	}
	// A task queued meanwhile would have gone to any registered worker.
	code, _, _ := b.send("POST", "/run-task", `{"task_id":"q1","task_type":"x","label":"m","return_result":false}`, "X-API-Key", testAPIKey)
	if code != 202 {
		t.Fatalf("async submit with a key: %d", code)
	}
	b.d.hub.mu.Lock()
	n := len(b.d.hub.workers)
	b.d.hub.mu.Unlock()
	if n != 0 {
		t.Fatalf("refused dials registered %d workers", n)
	}
	// The right token is served and gets the queued task.
	b.workerToken = testWorkerToken
	b.apiKey = testAPIKey
	w := b.dial("good", "m")
	if a := w.assignment(); a.TaskId != "q1" {
		t.Fatalf("assignment %v", a)
	}
}

func TestTaskEndpointsRefuseBadCredentials(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{WorkerTokens: []string{testWorkerToken}, APIKeys: []string{testAPIKey}})
	task := `{"task_id":"p1","task_type":"x","label":"m","return_result":false}`
	for _, tc := range []struct {
		name   string
		header []string
		status int
		want   string
	}{
		{"no key", nil, 401, "API key required"},
		{"wrong bearer", []string{"Authorization", "Bearer nope"}, 401, "API key refused"},
		{"wrong X-API-Key", []string{"X-API-Key", "nope"}, 401, "API key refused"},
		{"worker token", []string{"Authorization", "Bearer " + testWorkerToken}, 403, "worker token is not an API key"},
		{"malformed", []string{"Authorization", "Bearer two words"}, 401, "API key required"},
	} {
		for _, path := range []string{"/run-task", "/tasks/p1", "/upload-model"} {
			method := "POST"
			if path == "/tasks/p1" {
				method = "GET"
			}
			code, _, v := b.send(method, path, task, tc.header...)
			if code != tc.status || !strings.Contains(v["error"].(string), tc.want) {
				t.Fatalf("%s on %s: %d %v, want %d containing %q", tc.name, path, code, v, tc.status, tc.want)
			}
		}
	}
	b.untouched()
	// Both ways of presenting a key work.
	if code, _, v := b.send("POST", "/run-task", task, "Authorization", "bearer "+testAPIKey); code != 202 {
		t.Fatalf("bearer key: %d %v", code, v)
	}
	if code, _, v := b.send("GET", "/tasks/p1", "", "X-API-Key", testAPIKey); code != 200 || v["status"] != "queued" {
		t.Fatalf("X-API-Key: %d %v", code, v)
	}
}

func TestOpsAuth(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{APIKeys: []string{testAPIKey}, OpsAuth: true})
	for _, path := range []string{"/workers", "/workers?detail=true", "/labels", "/metrics", "/debug/pprof/"} {
		if code, _, v := b.send("GET", path, ""); code != 401 {
			t.Fatalf("%s without a key: %d %v", path, code, v)
		}
		if code, _, _ := b.send("GET", path, "", "X-API-Key", "wrong"); code != 401 {
			t.Fatalf("%s with a wrong key: %d", path, code)
		}
	}
	for _, path := range []string{"/workers", "/labels"} {
		if code, _, v := b.send("GET", path, "", "X-API-Key", testAPIKey); code != 200 {
			t.Fatalf("%s with the key: %d %v", path, code, v)
		}
	}
	if code, _, v := b.send("GET", "/health", ""); code != 200 || v["message"] != "OK" {
		t.Fatalf("/health must stay open: %d %v", code, v)
	}
	// Without OpsAuth, the ops endpoints stay open while the task API needs a key.
	open := setup(t, Config{APIKeys: []string{testAPIKey}})
	if code, _, v := open.send("GET", "/workers", ""); code != 200 {
		t.Fatalf("/workers without OpsAuth: %d %v", code, v)
	}
	if code, _, _ := open.send("POST", "/run-task", `{"task_type":"x","label":"m"}`); code != 401 {
		t.Fatalf("/run-task without a key: %d", code)
	}
	// Draining changes the fleet: it needs a key whatever OpsAuth says.
	if code, _, _ := open.send("POST", "/workers/w1/drain", ""); code != 401 {
		t.Fatalf("drain without a key: %d", code)
	}
	if code, _, v := open.send("POST", "/workers/w1/drain", "", "X-API-Key", testAPIKey); code != 404 {
		t.Fatalf("drain of an unknown worker with the key: %d %v", code, v)
	}
	open.untouched()
}

// Credentials are checked before routing answers: with --ops-auth an unknown path or a
// known one with the wrong method is a 401 without a key, and with a key the router's
// own answers (404, 405 with Allow) stand.
func TestRoutingAnswersBehindAuth(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{APIKeys: []string{testAPIKey}, OpsAuth: true})
	for _, c := range []struct{ method, path string }{{"GET", "/nope"}, {"GET", "/run-task"}, {"DELETE", "/workers/w1/drain"}} {
		if code, _, v := b.send(c.method, c.path, ""); code != 401 {
			t.Errorf("%s %s without a key: %d %v, want 401", c.method, c.path, code, v)
		}
	}
	if code, _, v := b.send("GET", "/nope", "", "X-API-Key", testAPIKey); code != 404 {
		t.Errorf("GET /nope with the key: %d %v, want 404", code, v)
	}
	code, h, v := b.send("GET", "/run-task", "", "X-API-Key", testAPIKey)
	if code != 405 || !strings.Contains(h.Get("Allow"), "POST") {
		t.Errorf("GET /run-task with the key: %d Allow %q %v, want 405 allowing POST", code, h.Get("Allow"), v)
	}
	if code, h, v := b.send("POST", "/health", ""); code != 405 || !strings.Contains(h.Get("Allow"), "GET") {
		t.Errorf("POST /health: %d Allow %q %v, want 405 allowing GET, with no key needed", code, h.Get("Allow"), v)
	}
	b.untouched()
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestRevokedWorkerTokenIsRefusedAndDisconnected(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "worker-tokens")
	writeFile(t, file, "# fleet A\nkeep-token\n\n  drop-token  \n")
	b := setup(t, Config{WorkerTokensFile: file})
	b.workerToken = "keep-token"
	keep := b.dial("keep", "m")
	b.workerToken = "drop-token"
	drop := b.dial("drop", "m")
	dropConn := b.registered("drop")

	// A malformed file is not applied: both tokens stay accepted.
	writeFile(t, file, "keep-token\nbad token with spaces\n")
	if err := b.d.ReloadCredentials(); err == nil || !strings.Contains(err.Error(), "line 2") || strings.Contains(err.Error(), "bad token") {
		t.Fatalf("malformed file: %v, want an error naming line 2 and not the secret", err)
	}
	if _, resp, err := b.dialWith("drop-2", "Bearer drop-token"); err != nil {
		t.Fatalf("after a failed reload the old tokens must stay: %v %v", err, resp)
	}

	// SIGHUP with drop-token removed: the connection that used it is closed with
	// UNAUTHORIZED, new dials with it are refused, the other worker keeps serving.
	writeFile(t, file, "# fleet A\nkeep-token\n")
	if err := b.d.ReloadCredentials(); err != nil {
		t.Fatal(err)
	}
	if code, text := drop.closeCode(); code != int(pb.CloseCode_CLOSE_CODE_UNAUTHORIZED) || !strings.Contains(text, "revoked") {
		t.Fatalf("revoked worker closed with %d %q", code, text)
	}
	if _, resp, err := b.dialWith("drop-3", "Bearer drop-token"); err == nil || resp == nil || resp.StatusCode != 401 {
		t.Fatalf("dial with a revoked token: err %v resp %v", err, resp)
	}
	b.awaitGone(dropConn) // drop-2 never said hello: it was never listed
	ans := b.postAsync(`{"task_type":"x","label":"m"}`)
	keep.finish(keep.assignment(), true, "{}")
	if got := <-ans; got.status != 200 || got.body["worker_id"] != "keep" {
		t.Fatalf("task after the revocation: %v", got)
	}
	if ids := b.workers(); len(ids) != 1 || ids[0] != "keep" {
		t.Fatalf("workers after the revocation: %v", ids)
	}
}

func TestExposureNeedsCredentialsOrTheInsecureFlag(t *testing.T) {
	t.Parallel()
	both := Config{WorkerTokens: []string{"w"}, APIKeys: []string{"k"}}
	for _, tc := range []struct {
		name string
		cfg  Config
		want string // empty: accepted
	}{
		{"loopback v4", Config{Addr: "127.0.0.1:0"}, ""},
		{"loopback v6", Config{Addr: "[::1]:0"}, ""},
		{"localhost", Config{Addr: "localhost:0"}, ""},
		{"any interface", Config{Addr: "0.0.0.0:0"}, "--insecure-no-auth"},
		{"empty host", Config{Addr: ":8080"}, "--insecure-no-auth"},
		{"LAN address", Config{Addr: "192.168.1.10:8080"}, "--insecure-no-auth"},
		{"host name", Config{Addr: "dispatcher.internal:8080"}, "--insecure-no-auth"},
		{"worker tokens only", Config{Addr: "0.0.0.0:0", WorkerTokens: []string{"w"}}, "anyone could submit tasks"},
		{"API keys only", Config{Addr: "0.0.0.0:0", APIKeys: []string{"k"}}, "anyone could connect as a worker"},
		{"both sides", Config{Addr: "0.0.0.0:0", WorkerTokens: both.WorkerTokens, APIKeys: both.APIKeys}, ""},
		{"insecure flag", Config{Addr: "0.0.0.0:0", InsecureNoAuth: true}, ""},
		{"ops auth without keys", Config{OpsAuth: true}, "OpsAuth needs APIKeys"},
		{"cert without key", Config{TLSCert: "c.pem"}, "TLSCert and TLSKey"},
		{"unreadable cert", Config{TLSCert: "/nonexistent/c.pem", TLSKey: "/nonexistent/k.pem"}, "TLSCert/TLSKey"},
		{"token with a space", Config{WorkerTokens: []string{"a b"}}, "WorkerTokens[0]"},
		{"missing tokens file", Config{WorkerTokensFile: "/nonexistent/tokens"}, "WorkerTokensFile"},
		{"a secret on both sides", Config{WorkerTokens: []string{"w", "shared"}, APIKeys: []string{"k", "shared"}}, "both a worker token and an API key"},
	} {
		_, err := New(tc.cfg)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: refused: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: got %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}

func TestAPIKeysFileReload(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "api-keys")
	writeFile(t, file, "key-1\nkey-2\n")
	b := setup(t, Config{APIKeysFile: file})
	task := `{"task_type":"x","label":"m","return_result":false}`
	if code, _, _ := b.send("POST", "/run-task", task, "X-API-Key", "key-2"); code != 202 {
		t.Fatalf("key-2 before the reload: %d", code)
	}
	writeFile(t, file, "key-1\n")
	if err := b.d.ReloadCredentials(); err != nil {
		t.Fatal(err)
	}
	if code, _, _ := b.send("POST", "/run-task", task, "X-API-Key", "key-2"); code != 401 {
		t.Fatalf("revoked key-2: %d", code)
	}
	if code, _, _ := b.send("POST", "/run-task", task, "Authorization", "Bearer key-1"); code != 202 {
		t.Fatalf("key-1 after the reload: %d", code)
	}
	if q := b.d.hub.sched.QueuedTasks(); q != 2 {
		t.Fatalf("queued %d, want 2", q)
	}
}

// A reload that would put one secret on both sides is refused, and the keys in force
// stay.
func TestReloadRefusesASecretOnBothSides(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "api-keys")
	writeFile(t, file, "key-1\n")
	b := setup(t, Config{APIKeysFile: file, WorkerTokens: []string{"worker-secret"}})
	writeFile(t, file, "key-1\nworker-secret\n")
	if err := b.d.ReloadCredentials(); err == nil || !strings.Contains(err.Error(), "both a worker token and an API key") {
		t.Fatalf("reload with a shared secret: %v", err)
	}
	task := `{"task_type":"x","label":"m","return_result":false}`
	if code, _, _ := b.send("POST", "/run-task", task, "X-API-Key", "worker-secret"); code != 403 {
		t.Errorf("the worker token as an API key after the refused reload: %d, want 403", code)
	}
	if code, _, _ := b.send("POST", "/run-task", task, "X-API-Key", "key-1"); code != 202 {
		t.Errorf("key-1 after the refused reload: %d", code)
	}
}

// BenchmarkProducerAuth is what an API key adds to every /run-task: the header, a
// sha256 and a constant-time pass over the accepted keys (here 10).
func BenchmarkProducerAuth(b *testing.B) {
	keys := make([]string, 10)
	for i := range keys {
		keys[i] = fmt.Sprintf("producer-key-%02d-%s", i, strings.Repeat("k", 32))
	}
	d, err := New(Config{APIKeys: keys})
	if err != nil {
		b.Fatal(err)
	}
	h := d.authorize(func(echo.Context) error { return nil })
	req := httptest.NewRequest(http.MethodPost, "/run-task", nil)
	req.Header.Set("Authorization", "Bearer "+keys[9])
	rec := httptest.NewRecorder()
	c := d.echo.NewContext(req, rec)
	c.SetPath("/run-task")
	b.ReportAllocs()
	for b.Loop() {
		if err := h(c); err != nil || rec.Code != http.StatusOK {
			b.Fatal(err, rec.Code)
		}
	}
}
