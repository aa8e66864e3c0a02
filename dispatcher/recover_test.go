package dispatcher

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/rs/zerolog"
)

// A handler's panic is answered with a JSON 500 and logged once, through the
// dispatcher's logger, with the panicking goroutine's stack; the server goes on.
func TestHandlerPanicIsAnswered500AndLogged(t *testing.T) {
	t.Parallel()
	var logs lockedBuffer
	d, err := New(Config{Logger: zerolog.New(&logs)})
	if err != nil {
		t.Fatal(err)
	}
	d.echo.GET("/test-panic", func(echo.Context) error { panic("label table corrupt") })
	srv := httptest.NewServer(d.Handler())
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

	var lines []map[string]any
	for l := range strings.Lines(logs.String()) {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line is not JSON: %q", l)
		}
		lines = append(lines, m)
	}
	if len(lines) != 1 {
		t.Fatalf("want one log line for the panic, got %d:\n%s", len(lines), logs.String())
	}
	l := lines[0]
	stack, _ := l["stack"].(string)
	if l["message"] != "handler panicked" || l["level"] != "error" || l["panic"] != "label table corrupt" ||
		l["path"] != "/test-panic" || !strings.Contains(stack, "TestHandlerPanicIsAnswered500AndLogged") {
		t.Fatalf("panic log line lacks what it should say: %v", l)
	}

	// The server is still serving.
	resp, err = http.Get(srv.URL + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/health after a panic: %d", resp.StatusCode)
	}
}

// http.ErrAbortHandler is not an error to answer: net/http drops the connection.
func TestHandlerAbortDropsTheConnection(t *testing.T) {
	t.Parallel()
	var logs lockedBuffer
	d, err := New(Config{Logger: zerolog.New(&logs)})
	if err != nil {
		t.Fatal(err)
	}
	d.echo.GET("/test-abort", func(echo.Context) error { panic(http.ErrAbortHandler) })
	srv := httptest.NewServer(d.Handler())
	defer srv.Close()

	resp, err := http.Get(srv.URL + "/test-abort")
	if err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("got an answer (%d %q), want the connection dropped", resp.StatusCode, b)
	}
	if !errors.Is(err, io.EOF) && !strings.Contains(err.Error(), "EOF") {
		t.Fatalf("want EOF from a dropped connection, got %v", err)
	}
	if strings.Contains(logs.String(), "handler panicked") {
		t.Fatalf("an abort was logged as a panic:\n%s", logs.String())
	}
}
