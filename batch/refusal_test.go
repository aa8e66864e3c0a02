package batch

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
)

// snapshot is every file under dir, by path, with its contents.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	files := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		files[p] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// sameFiles fails the test when after is not before: a file added, removed or changed.
func sameFiles(t *testing.T, before, after map[string]string) {
	t.Helper()
	for p, b := range before {
		if a, ok := after[p]; !ok {
			t.Errorf("%s was removed", filepath.Base(p))
		} else if a != b {
			t.Errorf("%s changed:\n%q\nwas\n%q", filepath.Base(p), a, b)
		}
	}
	for p, a := range after {
		if _, ok := before[p]; !ok {
			t.Errorf("%s was created (%d bytes)", filepath.Base(p), len(a))
		}
	}
}

// holdLock takes path's lock as another run would, creating the file, until the test
// ends. It skips the test where locks do not exist.
func holdLock(t *testing.T, path string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := lockFile(f); err != nil {
		t.Fatal(err)
	}
	probe, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	if lockFile(probe) == nil {
		t.Skip("no file locks here")
	}
}

// skipWithoutLocks skips the test where file locks do not exist.
func skipWithoutLocks(t *testing.T) {
	t.Helper()
	holdLock(t, filepath.Join(t.TempDir(), "probe"))
}

// runResult is a Run's outcome, sent from the goroutine that ran it.
type runResult struct {
	s   Summary
	err error
}

// goRun runs cfg on a goroutine of its own; its outcome comes on the channel.
func goRun(cfg Config) <-chan runResult {
	done := make(chan runResult, 1)
	go func() {
		s, err := runBounded(cfg)
		done <- runResult{s, err}
	}()
	return done
}

// A refused run leaves the job's directory as it found it. The lock on the output and
// rejected files created them when they did not exist, before any check that refuses
// the run: a user then found an empty output, as if the job had run.
func TestRefusedRunLeavesTheFilesAsItFoundThem(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		// prepare sets the scene in the job's directory and the run's config.
		prepare func(t *testing.T, cfg *Config)
		err     string
	}{
		{"invalid config", func(_ *testing.T, cfg *Config) { cfg.Order = "random" }, "Order must be"},
		{"input missing", func(_ *testing.T, cfg *Config) { cfg.Input += ".typo" }, "input:"},
		{"rejected file locked by another run", func(t *testing.T, cfg *Config) {
			cfg.Rejected = filepath.Join(filepath.Dir(cfg.Output), "shared.rejected.jsonl")
			holdLock(t, cfg.Rejected)
		}, "in use by another batch job"},
		{"rejected directory missing", func(_ *testing.T, cfg *Config) {
			cfg.Rejected = filepath.Join(filepath.Dir(cfg.Output), "no-such-dir", "rejected.jsonl")
		}, "no such file or directory"},
		{"checkpoint directory missing", func(_ *testing.T, cfg *Config) {
			cfg.Checkpoint = filepath.Join(filepath.Dir(cfg.Output), "no-such-dir", "cp.json")
		}, "writing checkpoint"},
		{"corrupt checkpoint", func(t *testing.T, cfg *Config) {
			if err := os.WriteFile(cfg.Output+".checkpoint", []byte("{not json\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "is corrupt"},
		{"empty output there before, corrupt checkpoint", func(t *testing.T, cfg *Config) {
			for p, b := range map[string]string{cfg.Output: "", cfg.Output + ".checkpoint": "{not json\n"} {
				if err := os.WriteFile(p, []byte(b), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}, "is corrupt"},
		{"fresh job over an existing output", func(t *testing.T, cfg *Config) {
			if err := os.WriteFile(cfg.Output, []byte("{\"someone's\":\"results\"}\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "there is no checkpoint"},
		{"checkpoint of another output", func(t *testing.T, cfg *Config) {
			run(t, *cfg)
			cfg.Checkpoint = cfg.Output + ".checkpoint"
			cfg.Output = filepath.Join(filepath.Dir(cfg.Output), "other.jsonl")
		}, "--output"},
		{"output removed since the checkpoint", func(t *testing.T, cfg *Config) {
			run(t, *cfg)
			if err := os.Remove(cfg.Output); err != nil {
				t.Fatal(err)
			}
		}, "shorter than the checkpoint's"},
		{"control address in use", func(t *testing.T, cfg *Config) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ln.Close() })
			cfg.ControlAddr = ln.Addr().String()
		}, "control server"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeDispatcher(t, nil)
			cfg := setup(t, f, taskLines(3))
			tt.prepare(t, &cfg)
			dir := filepath.Dir(cfg.Output)
			before, sent := snapshot(t, dir), len(f.requests(1))
			_, err := runBounded(cfg)
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Fatalf("Run: %v; want a refusal saying %q", err, tt.err)
			}
			sameFiles(t, before, snapshot(t, dir))
			if n := len(f.requests(1)) - sent; n > 0 {
				t.Errorf("the refused run submitted line 1 %d times", n)
			}
		})
	}
}

// A job stopped before it writes a line (here the dispatcher refuses the job's API
// key) leaves no output or rejected file behind: empty, they looked like a job that
// had run. Its checkpoint stays, since tasks went out under its job id, and the run
// after it resumes that job.
func TestRunStoppedBeforeWritingALineLeavesNoEmptyFiles(t *testing.T) {
	t.Parallel()
	var keyFixed atomic.Bool
	f := newFakeDispatcher(t, func(context.Context, runTaskBody, int, int) (int, string) {
		if !keyFixed.Load() {
			return http.StatusUnauthorized, `{"error":"unauthorized"}`
		}
		return http.StatusOK, ""
	})
	cfg := setup(t, f, taskLines(3))
	_, err := runBounded(cfg)
	if err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("Run with a refused key: %v; want it stopped by the 401", err)
	}
	for _, p := range []string{cfg.Output, cfg.Output + ".rejected.jsonl"} {
		if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s is left after a run that wrote no line (stat: %v)", filepath.Base(p), err)
		}
	}
	cp, ok, err := loadCheckpoint(cfg.Output + ".checkpoint")
	if !ok || err != nil || cp.Lines != 0 {
		t.Fatalf("checkpoint %+v, %v, %v: want the job's, with no line", cp, ok, err)
	}

	keyFixed.Store(true)
	s := run(t, cfg)
	if s.JobID != cp.JobID || s.StartLine != 1 {
		t.Errorf("the next run is job %s from line %d; want job %s resumed from line 1", s.JobID, s.StartLine, cp.JobID)
	}
	checkOutput(t, cfg.Output, 3)
}

// A refused run removes only a file it created and locked. Here run A creates the
// output, run B opens and locks it first and runs; A, refused by B's lock, must leave
// the file to B: removed, it took B's results with it.
func TestRefusedRunLeavesTheFileAnotherRunLockedFirst(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	f := newFakeDispatcher(t, func(ctx context.Context, _ runTaskBody, line, _ int) (int, string) {
		if line == 2 { // B runs, holding its locks, until the test has seen A refused
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return http.StatusOK, ""
	})
	cfg := setup(t, f, taskLines(3))
	skipWithoutLocks(t)

	aCreated, bLocked := make(chan struct{}), make(chan struct{})
	a := cfg
	a.opened = func(path string) {
		if path == cfg.Output { // created (the file was not there), not yet locked
			close(aCreated)
			<-bLocked
		}
	}
	aDone := goRun(a)
	select {
	case <-aCreated:
	case r := <-aDone:
		t.Fatalf("run A ended before it created the output: %v", r.err)
	}
	bDone := goRun(cfg)
	<-f.arrivedCh // B submits only once it holds its locks
	close(bLocked)
	if r := <-aDone; r.err == nil || !strings.Contains(r.err.Error(), "in use by another batch job") {
		t.Errorf("run A: %v; want it refused by B's lock", r.err)
	}
	close(release)
	if r := <-bDone; r.err != nil {
		t.Fatalf("run B: %v", r.err)
	}
	checkOutput(t, cfg.Output, 3)
}

// A run that opened the output just before a refused run removed it must not lock and
// write that removed file, which no name leads to: its results would be lost, exit 0.
// Here run A creates the output and is held before its next lock (the rejected file,
// locked by another job); B opens the output; A is refused and removes it; B goes on.
func TestRunOnAFileARefusedRunRemovedWritesANewOne(t *testing.T) {
	t.Parallel()
	f := newFakeDispatcher(t, nil)
	cfg := setup(t, f, taskLines(3))
	otherRejected := filepath.Join(filepath.Dir(cfg.Output), "other.rejected.jsonl")
	holdLock(t, otherRejected)

	aHolds, bOpened := make(chan struct{}), make(chan struct{})
	a := cfg
	a.Rejected = otherRejected
	a.opened = func(path string) {
		if path == otherRejected { // the output is created and locked
			close(aHolds)
			<-bOpened
		}
	}
	aDone := goRun(a)
	select {
	case <-aHolds:
	case r := <-aDone:
		t.Fatalf("run A ended before it locked the output: %v", r.err)
	}
	b := cfg
	var aEnded runResult
	first := true
	b.opened = func(path string) {
		if path == cfg.Output && first { // A's output, opened; A still holds it
			first = false
			close(bOpened)
			aEnded = <-aDone
		}
	}
	s, err := runBounded(b)
	if aEnded.err == nil || !strings.Contains(aEnded.err.Error(), "in use by another batch job") {
		t.Errorf("run A: %v; want it refused by the rejected file's lock", aEnded.err)
	}
	if err != nil {
		t.Fatalf("run B: %v", err)
	}
	if s.Lines != 3 {
		t.Errorf("run B wrote %d lines, want 3", s.Lines)
	}
	checkOutput(t, cfg.Output, 3)
}

// An output named by a link to a file not there yet (a job directory of links to
// another volume): the exclusive create refuses any link, and the run must create the
// link's target as before rather than take the link for a file a refused run removed
// and try again for ever.
func TestOutputThroughALinkToAFileNotThereYet(t *testing.T) {
	t.Parallel()
	f := newFakeDispatcher(t, nil)
	cfg := setup(t, f, taskLines(3))
	target := filepath.Join(t.TempDir(), "results.jsonl")
	if err := os.Symlink(target, cfg.Output); err != nil {
		t.Skipf("symlink: %v", err)
	}
	run(t, cfg)
	checkOutput(t, target, 3)
}
