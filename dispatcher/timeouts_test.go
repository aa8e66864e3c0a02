package dispatcher

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// failureBound bounds the waits below for something the server should do within a
// short configured timeout: the test fails past it, it does not synchronise.
const failureBound = 10 * time.Second

// stallBody opens a connection to b and sends a request whose body stops after its
// first bytes.
func stallBody(t *testing.T, b *bundle, path string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(b.srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	req := "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n{\"task_type\":"
	if _, err := conn.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	return conn
}

// readAnswer reads the server's answer on conn within failureBound.
func readAnswer(t *testing.T, conn net.Conn) (*http.Response, map[string]any) {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(failureBound))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer within %v: %v", failureBound, err)
	}
	defer resp.Body.Close()
	var out map[string]any
	raw, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(raw, &out)
	return resp, out
}

// A body that stalls after its headers is answered 408 once BodyReadTimeout has
// passed, rather than hold its handler (and a pooled buffer) for ever; a route that
// does not read its body answers too (net/http discards the body first, which the
// deadline ends), and the connection is closed.
func TestStalledBodyIsCutOff(t *testing.T) {
	t.Parallel()
	up := newUploader(t, func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte(`{}`)) })
	b, cancel, runErr := run(t, Config{ShutdownTimeout: time.Second, BodyReadTimeout: 200 * time.Millisecond, UploaderURL: up})
	defer func() { cancel(); <-runErr }()
	for _, tc := range []struct {
		path string
		want int
	}{
		{"/run-task", http.StatusRequestTimeout},
		{"/upload-model", http.StatusRequestTimeout},
		{"/workers/nobody/drain", http.StatusNotFound}, // net/http discards the unread body before answering
	} {
		conn := stallBody(t, b, tc.path)
		resp, out := readAnswer(t, conn)
		if resp.StatusCode != tc.want {
			t.Errorf("%s with a stalled body: %d %v, want %d", tc.path, resp.StatusCode, out, tc.want)
		}
		if msg, _ := out["error"].(string); tc.want == http.StatusRequestTimeout && !strings.Contains(msg, "--body-read-timeout") {
			t.Errorf("%s: error %q does not name --body-read-timeout", tc.path, msg)
		}
		conn.SetReadDeadline(time.Now().Add(failureBound))
		if _, err := conn.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
			t.Errorf("%s: connection after the answer: %v, want it closed", tc.path, err)
		}
	}
}

// BodyReadTimeout (Run's ReadTimeout) bounds reading the request only: a synchronous
// producer waits for its answer well past it, and worker connections, which are
// requests too until their upgrade, are not touched by it.
func TestBodyReadTimeoutSparesAnswerWaitsAndWorkers(t *testing.T) {
	t.Parallel()
	waiting := make(chan string, 1)
	b, cancel, runErr := run(t, Config{ShutdownTimeout: time.Second, BodyReadTimeout: 200 * time.Millisecond,
		onWait: func(id string) { waiting <- id }})
	defer func() { cancel(); <-runErr }()
	w := b.dial("w1", "m")
	ans := b.postAsync(`{"task_id":"slow","task_type":"x","label":"m"}`)
	a := w.assignment()
	<-waiting
	// A body stalled after the wait began is cut off: the waiting request's deadline,
	// had it been left in place, has passed too.
	if resp, out := readAnswer(t, stallBody(t, b, "/run-task")); resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("stalled body: %d %v", resp.StatusCode, out)
	}
	w.finish(a, true, `"late but fine"`)
	if got := <-ans; got.status != 200 || got.body["result"] != "late but fine" {
		t.Fatalf("synchronous wait past BodyReadTimeout: %d %v", got.status, got.body)
	}
	// The worker's connection outlived the timeout too.
	ans = b.postAsync(`{"task_id":"next","task_type":"x","label":"m"}`)
	w.finish(w.assignment(), true, `"ok"`)
	if got := <-ans; got.status != 200 {
		t.Fatalf("task after the timeout: %v", got)
	}
}

// Run's server closes a kept-alive connection that waits longer than IdleTimeout for
// its next request, even one that sent the first bytes of it.
func TestIdleKeepAliveIsClosed(t *testing.T) {
	t.Parallel()
	b, cancel, runErr := run(t, Config{ShutdownTimeout: time.Second, IdleTimeout: 50 * time.Millisecond})
	defer func() { cancel(); <-runErr }()
	for _, next := range []string{"", "GET"} {
		conn, err := net.Dial("tcp", strings.TrimPrefix(b.srv.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := conn.Write([]byte("GET /health HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
			t.Fatal(err)
		}
		if resp, _ := readAnswer(t, conn); resp.StatusCode != 200 {
			t.Fatalf("GET /health: %d", resp.StatusCode)
		}
		conn.Write([]byte(next)) // part of a next request, or nothing
		conn.SetReadDeadline(time.Now().Add(failureBound))
		if n, err := conn.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
			t.Fatalf("idle connection (sent %q after the first request): read %d, %v; want it closed", next, n, err)
		}
	}
}
