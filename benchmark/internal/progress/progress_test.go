package progress

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestRender(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name                string
		done, total, failed int
		elapsed             time.Duration
		want                []string
	}{
		{"start", 0, 100, 0, 0, []string{"routing [>", "] 0/100   0%"}},
		{"half", 50, 100, 0, 10 * time.Second, []string{"[===============>", "50/100  50%", "5.0 req/s", "eta 10s"}},
		{"done with failures", 100, 100, 3, 20 * time.Second, []string{"[" + strings.Repeat("=", 30) + "]", "100/100 100%", "5.0 req/s", "3 failed"}},
	}
	for _, tt := range tests {
		got := Render("routing", tt.done, tt.total, tt.failed, tt.elapsed)
		for _, w := range tt.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: %q lacks %q", tt.name, got, w)
			}
		}
		if tt.done == tt.total && strings.Contains(got, "eta") {
			t.Errorf("%s: %q shows an eta when done", tt.name, got)
		}
	}
}

func TestNilBar(t *testing.T) {
	t.Parallel()
	b := Start(nil, "x", 10, time.Millisecond)
	b.Add(true)
	b.Finish()
}

func TestBarFinish(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	b := Start(&buf, "random", 4, time.Hour)
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() { b.Add(i != 0) })
	}
	wg.Wait()
	b.Finish()
	// Finish has returned: the draw goroutine is done with buf.
	out := buf.String()
	if !strings.HasPrefix(out, "\rrandom [") || !strings.HasSuffix(out, "\n") {
		t.Errorf("output %q", out)
	}
	if !strings.Contains(out, "4/4 100%") || !strings.Contains(out, "1 failed") {
		t.Errorf("final line %q", out)
	}
}
