package batch

import (
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// The /work-timeout body is one {"timeout": seconds} from above 0 to 24 h, bounded as
// seconds before it becomes a Duration (whose conversion past int64 is
// platform-dependent), with nothing after it; anything else is refused, saying why.
func TestParseWorkTimeout(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		body, err string
	}{
		{`{"timeout": 1e300}`, "between 0 and 86400 seconds, got 1e+300"},
		{`{"timeout": -1e300}`, "got -1e+300"},
		{`{"timeout": 9223372037}`, "got 9.223372037e+09"},
		{`{"timeout": 9.3e9}`, "got 9.3e+09"},
		{`{"timeout": 86400.001}`, "got 86400.001"},
		{`{"timeout": 0}`, "got 0"},
		{`{"timeout": -0}`, "got -0"},
		{`{"timeout": 1e-10}`, "below a nanosecond"},
		{`{"timeout": 1e400}`, "cannot unmarshal"},
		{`{"timeout": "5"}`, "cannot unmarshal"},
		{`{"timeout": null}`, "no timeout"},
		{`{}`, "no timeout"},
		{`null`, "no timeout"},
		{``, "EOF"},
		{`{"timeout": 5`, "unexpected EOF"},
		{`{"timeout": 5}{"timeout": 86400}`, "nothing after it"},
		{`{"timeout": 5} x`, "nothing after it"},
		{`{"timeout": 5}` + strings.Repeat(" ", maxWorkTimeoutBody), "at most 4096 bytes"},
	} {
		d, err := parseWorkTimeout(strings.NewReader(c.body))
		if err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("%.40q: %v, %v; want an error saying %q", c.body, d, err, c.err)
		}
	}
	for body, want := range map[string]time.Duration{
		`{"timeout": 0.5}`:       500 * time.Millisecond,
		`{"timeout": 86400}`:     24 * time.Hour,
		`{"timeout": 1e-9}`:      time.Nanosecond,
		" {\"timeout\": 1600}\n": 1600 * time.Second,
	} {
		if d, err := parseWorkTimeout(strings.NewReader(body)); err != nil || d != want {
			t.Errorf("%q: %v, %v; want %v", body, d, err, want)
		}
	}
}

// A refused body changes nothing: a second object after the first used to be ignored,
// and the first applied.
func TestWorkTimeoutRefusedBodyChangesNothing(t *testing.T) {
	t.Parallel()
	j, ln := controlledJob(t)
	for _, body := range []string{`{"timeout": 5}{"timeout": 86400}`, `{"timeout": 5} ]`, `{"timeout": 1e300}`, `{"timeout": 9223372037}`} {
		resp, err := noKeepAlive.Post("http://"+ln.Addr().String()+"/work-timeout", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		var e map[string]string
		_ = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || e["error"] == "" || time.Duration(j.timeout.Load()) != time.Minute {
			t.Errorf("%s: %d %v, work timeout %v; want 400 with an error, and 1m kept", body, resp.StatusCode, e, time.Duration(j.timeout.Load()))
		}
	}
}

// FuzzParseWorkTimeout: the control body is an operator's (or anyone's who reaches the
// port): whatever it holds, parseWorkTimeout refuses it with a message or returns the
// body's seconds as a Duration from above 0 to maxWorkTimeout.
func FuzzParseWorkTimeout(f *testing.F) {
	for _, s := range []string{
		`{"timeout": 0.5}`, `{"timeout": 1e300}`, `{"timeout": 9223372037}`, `{"timeout": -1}`, `{"timeout": 1e-10}`,
		`{"timeout": 5}{"timeout": 6}`, `{"Timeout": 86400}`, `null`, `{"timeout": 1600, "timeout": null}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		d, err := parseWorkTimeout(strings.NewReader(string(body)))
		if err != nil {
			if d != 0 || err.Error() == "" {
				t.Fatalf("%v with error %q", d, err)
			}
			return
		}
		if d <= 0 || d > maxWorkTimeout {
			t.Fatalf("%q accepted as %v", body, d)
		}
		var b workTimeoutBody
		if len(body) > maxWorkTimeoutBody || json.Unmarshal(body, &b) != nil || b.Timeout == nil {
			t.Fatalf("%q accepted as %v, but it is not one {\"timeout\": seconds} within the bound", body, d)
		}
		if want := time.Duration(*b.Timeout * float64(time.Second)); d != want {
			t.Fatalf("%q accepted as %v, want %v", body, d, want)
		}
	})
}

// controlledJob is a job with a one-minute work timeout whose control endpoint listens
// on ln, stopped when the test ends.
func controlledJob(t *testing.T) (*job, net.Listener) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	j := &job{cfg: Config{ControlListener: ln}, timeoutChanged: make(chan struct{}, 1)}
	j.timeout.Store(int64(time.Minute))
	stop, err := j.startControl()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return j, ln
}
