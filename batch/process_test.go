package batch

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// buildBatch compiles cmd/batch into a temp dir: the process tests run the real binary.
func buildBatch(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the batch binary; skipped with -short")
	}
	bin := filepath.Join(t.TempDir(), "batch")
	out, err := exec.Command("go", "build", "-o", bin, "./cmd/batch").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// The job is killed with SIGKILL mid-job, after bytes were written past its last
// checkpoint (appended by the test, as a crash between a write and the checkpoint
// leaves them), and run again: every line is in the output exactly once, in order,
// the rejected file holds each bad line once, and the resumed job submits the line it
// stopped at under the same task id, so it attaches to the dispatcher's run.
func TestResumeAfterKill9(t *testing.T) {
	t.Parallel()
	bin := buildBatch(t)
	const n, stuck = 3000, 2000
	var firstRun atomic.Bool
	firstRun.Store(true)
	f := newFakeDispatcher(t, func(ctx context.Context, _ runTaskBody, line, _ int) (int, string) {
		if firstRun.Load() && line >= stuck {
			<-ctx.Done() // the first run gets no further than this
		}
		return http.StatusOK, ""
	})
	lines := taskLines(n, "a", "b", "c")
	lines[9], lines[19] = "not json", `{"label": 5}`
	cfg := setup(t, f, lines)
	args := []string{"--dispatcher", f.srv.URL, "--input", cfg.Input, "--output", cfg.Output,
		"--checkpoint-interval", "20ms", "--concurrency", "8", "--progress", "false", "--log-level", "warn", "--json"}
	logs, err := os.Create(filepath.Join(t.TempDir(), "batch.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logs.Close()
	first := dieWithTest(exec.Command(bin, args...))
	first.Stderr = logs
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	defer func() {
		if !killed {
			first.Process.Kill()
			first.Wait()
		}
	}()
	waitFor(t, "the first run to checkpoint every line before the stuck one", func() bool {
		cp, ok, _ := loadCheckpoint(cfg.Output + ".checkpoint")
		return ok && cp.Lines == stuck-1
	})
	if err := first.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = first.Wait()
	killed = true
	f.mu.Lock()
	var stuckReq runTaskBody // a line the first run submitted and got no answer for
	for _, r := range f.reqs {
		if lineOfID(r.TaskID) >= stuck {
			stuckReq = r
			break
		}
	}
	f.mu.Unlock()
	if stuckReq.TaskID == "" {
		t.Fatal("the first run submitted no line past the stuck one")
	}
	for _, p := range []string{cfg.Output, cfg.Output + ".rejected.jsonl"} {
		fh, err := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		fh.WriteString(`{"line":2000,"status":"completed","written":"after the checkpoint"}` + "\n")
		fh.Close()
	}

	firstRun.Store(false)
	second := dieWithTest(exec.Command(bin, args...))
	second.Stderr = logs
	out, err := second.Output()
	if err != nil {
		b, _ := os.ReadFile(logs.Name())
		t.Fatalf("resumed run: %v\n%s", err, b)
	}
	var s Summary
	if err := json.Unmarshal(out, &s); err != nil {
		t.Fatalf("summary %q: %v", out, err)
	}
	if s.StartLine != stuck || s.Lines != n-stuck+1 {
		t.Errorf("resumed run started at line %d and wrote %d lines; want %d and %d", s.StartLine, s.Lines, stuck, n-stuck+1)
	}
	checkOutput(t, cfg.Output, n, 10, 20)
	rej := readLines(t, cfg.Output+".rejected.jsonl")
	if len(rej) != 2 || !strings.HasPrefix(rej[0], `{"line":10,`) || !strings.HasPrefix(rej[1], `{"line":20,`) {
		t.Errorf("rejected file: %q", rej)
	}
	if reqs := f.requests(lineOfID(stuckReq.TaskID)); reqs[len(reqs)-1].TaskID != stuckReq.TaskID {
		t.Errorf("a line was resubmitted as %s, first as %s: the resumed job must reuse task ids", reqs[len(reqs)-1].TaskID, stuckReq.TaskID)
	}
}

// A bad flag value is bad usage: exit status 2, as README says, not a failed job's 1.
func TestBadFlagValueExits2(t *testing.T) {
	t.Parallel()
	bin := buildBatch(t)
	f := newFakeDispatcher(t, nil)
	cfg := setup(t, f, taskLines(1))
	for _, bad := range [][]string{{"--order", "random"}, {"--log-level", ""},
		{"--max-attempts", "0"}, {"--retry-delay", "0s"}, {"--concurrency", "0"}, {"--checkpoint-interval", "0s"}} {
		args := append([]string{"--dispatcher", f.srv.URL, "--input", cfg.Input, "--output", cfg.Output, "--progress", "false"}, bad...)
		out, err := dieWithTest(exec.Command(bin, args...)).CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Errorf("%q: %v, want exit status 2\n%s", bad, err, out)
		}
	}
}

// A dispatcher certificate the job does not trust fails the job at once with exit
// status 1, README's for an error, and says which URL and why; it hung, retrying.
func TestUntrustedCertificateExits1(t *testing.T) {
	t.Parallel()
	bin := buildBatch(t)
	srv := httptest.NewUnstartedServer(http.NotFoundHandler())
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes
	srv.StartTLS()
	t.Cleanup(srv.Close)
	cfg := setup(t, &fakeDispatcher{srv: srv}, taskLines(3))
	cmd := dieWithTest(exec.Command(bin, "--dispatcher", srv.URL, "--input", cfg.Input, "--output", cfg.Output, "--progress", "false", "--log-level", "error"))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("the job still ran 20 s on a dispatcher whose certificate it does not trust\n%s", stderr.String())
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Errorf("exit: %v, want status 1\n%s", err, stderr.String())
	}
	for _, want := range []string{srv.URL + "/run-task", "certificate signed by unknown authority"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr %q: want %q in it", stderr.String(), want)
		}
	}
}

// -h prints the usage and exits 0, as the other commands do: help asked for is not bad
// usage.
func TestHelpExits0(t *testing.T) {
	t.Parallel()
	out, err := dieWithTest(exec.Command(buildBatch(t), "-h")).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "-dispatcher") {
		t.Errorf("batch -h: %v, want exit status 0 and the usage\n%s", err, out)
	}
}

// Ctrl-C (SIGINT) stops the job: the lines written are checkpointed, the exit status
// is 130 and the message says to run the command again. When that last checkpoint
// fails, the message must not say the lines are checkpointed: the job exits 1 with the
// checkpoint's error (it was swallowed behind "interrupted").
func TestInterrupt(t *testing.T) {
	t.Parallel()
	bin := buildBatch(t)
	for _, tt := range []struct {
		name           string
		failCheckpoint bool
		code           int
		msg, notMsg    string
		cpLines        int64 // lines the checkpoint counts after the stop
	}{
		{"checkpointed", false, 130, "checkpointed: run the same command again to resume", "", 1},
		{"checkpoint fails", true, 1, "writing checkpoint", "checkpointed", 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeDispatcher(t, answerFirstLineOnly)
			cfg := setup(t, f, taskLines(5))
			cp := cfg.Output + ".checkpoint"
			// Only the fresh job's checkpoint and the one at the stop are written.
			cmd := dieWithTest(exec.Command(bin, "--dispatcher", f.srv.URL, "--input", cfg.Input, "--output", cfg.Output,
				"--checkpoint-interval", "1h", "--concurrency", "1", "--order", "file", "--progress", "false", "--log-level", "error"))
			var stderr strings.Builder
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer cmd.Process.Kill()
			// One at a time in file order, line 2 is issued once line 1's answer is
			// written (not checkpointed yet).
			for want := 1; want <= 2; want++ {
				select {
				case <-f.arrivedCh:
				case <-time.After(20 * time.Second):
					t.Fatalf("line %d was not issued", want)
				}
			}
			if tt.failCheckpoint {
				// The checkpoint's temporary file cannot be created where a directory is.
				if err := os.Mkdir(cp+".tmp", 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if err := cmd.Process.Signal(os.Interrupt); err != nil {
				t.Fatal(err)
			}
			err := cmd.Wait()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != tt.code {
				t.Errorf("exit: %v, want status %d\n%s", err, tt.code, stderr.String())
			}
			if !strings.Contains(stderr.String(), tt.msg) || (tt.notMsg != "" && strings.Contains(stderr.String(), tt.notMsg)) {
				t.Errorf("stderr %q: want %q in it, and not %q", stderr.String(), tt.msg, tt.notMsg)
			}
			c, _, _ := loadCheckpoint(cp)
			if c.Lines != tt.cpLines {
				t.Errorf("the checkpoint counts %d lines, want %d", c.Lines, tt.cpLines)
			}
		})
	}
}
