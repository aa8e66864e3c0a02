package batch

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
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
	first := exec.Command(bin, args...)
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
	second := exec.Command(bin, args...)
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
	out, err := exec.Command(bin, "--dispatcher", f.srv.URL, "--input", cfg.Input, "--output", cfg.Output,
		"--order", "random", "--progress", "false").CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Errorf("--order random: %v, want exit status 2\n%s", err, out)
	}
}
