package logcollector

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/rs/zerolog"
)

// panicLog is a log sink the server writes to while the test reads it.
type panicLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *panicLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *panicLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// A handler's panic is answered with a JSON 500 and logged once, through the
// collector's logger, with the panicking goroutine's stack.
func TestHandlerPanicIsAnswered500AndLogged(t *testing.T) {
	var logs panicLog
	col, err := New(Config{Dir: t.TempDir(), Logger: zerolog.New(&logs)})
	if err != nil {
		t.Fatal(err)
	}
	defer col.Close()
	col.echo.GET("/test-panic", func(echo.Context) error { panic("index corrupt") })
	srv := httptest.NewServer(col.Handler())
	defer srv.Close()

	resp, err := http.Get(srv.URL + "/test-panic")
	if err != nil {
		t.Fatal(err)
	}
	var body errorBody
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("answer is not JSON: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusInternalServerError || body.Error != "internal error" {
		t.Fatalf("got %d %q, want 500 \"internal error\"", resp.StatusCode, body.Error)
	}
	var panics []map[string]any
	for l := range strings.Lines(logs.String()) {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line is not JSON: %q", l)
		}
		if m["level"] == "error" {
			panics = append(panics, m)
		}
	}
	if len(panics) != 1 {
		t.Fatalf("want one error line for the panic, got %d:\n%s", len(panics), logs.String())
	}
	l := panics[0]
	stack, _ := l["stack"].(string)
	if l["message"] != "handler panicked" || l["error"] != "index corrupt" || l["path"] != "/test-panic" ||
		!strings.Contains(stack, "TestHandlerPanicIsAnswered500AndLogged") {
		t.Fatalf("panic log line lacks what it should say: %v", l)
	}
}
