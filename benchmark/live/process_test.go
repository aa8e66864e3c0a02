//go:build unix

package live

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// startHelper starts the test binary as a child in mode and returns it with the pid
// it reported ready (for "parent": the grandchild's).
func startHelper(t *testing.T, mode string) (*process, int) {
	t.Helper()
	dir := t.TempDir()
	fifo := filepath.Join(dir, "ready")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), helperEnv+"="+mode, "LIVE_TEST_FIFO="+fifo)
	p, err := startProcess("helper", os.Args[0], nil, env, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.stop(time.Second) })
	if mode == "fail" {
		return p, 0
	}
	// Opening the read end blocks until the child opens the write end.
	f, err := os.Open(fifo)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	line, err := bufio.NewReader(f).ReadString('\n')
	if err != nil {
		t.Fatalf("reading the helper's ready line: %v", err)
	}
	var pid int
	if _, err := fmt.Sscanf(line, "ready %d", &pid); err != nil {
		t.Fatalf("ready line %q: %v", line, err)
	}
	return p, pid
}

// gone reports whether pid no longer runs: absent, or a zombie nobody has reaped yet
// (a container's init may never reap it).
func gone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return errors.Is(err, os.ErrNotExist)
	}
	// The state follows the parenthesised command name.
	_, rest, _ := strings.Cut(string(b), ") ")
	return strings.HasPrefix(rest, "Z")
}

// waitGone waits for a process that is not our child to disappear. No signal tells
// us when a grandchild ends, so this polls; the bound is generous.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !gone(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("pid %d still runs", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestProcessStopGraceful(t *testing.T) {
	t.Parallel()
	p, _ := startHelper(t, "obedient")
	if err := p.stop(10 * time.Second); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if !p.exited() {
		t.Fatal("stop returned before the process was reaped")
	}
	if ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGTERM {
		t.Errorf("process ended with %v, want SIGTERM", p.cmd.ProcessState)
	}
	if err := p.stop(10 * time.Second); err != nil {
		t.Errorf("second stop: %v", err)
	}
}

func TestProcessStopKillsStubborn(t *testing.T) {
	t.Parallel()
	p, _ := startHelper(t, "stubborn")
	start := time.Now()
	err := p.stop(100 * time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "did not exit within 100ms of SIGTERM") {
		t.Fatalf("stop: %v, want a note that it was killed", err)
	}
	if took := time.Since(start); took < 100*time.Millisecond {
		t.Errorf("killed after %v, before the grace ended", took)
	}
	if ws := p.cmd.ProcessState.Sys().(syscall.WaitStatus); ws.Signal() != syscall.SIGKILL {
		t.Errorf("process ended with %v, want SIGKILL", p.cmd.ProcessState)
	}
	if again := p.stop(time.Second); again == nil || again.Error() != err.Error() {
		t.Errorf("second stop: %v, want the first result", again)
	}
}

func TestProcessStopTakesTheGroup(t *testing.T) {
	t.Parallel()
	p, grandchild := startHelper(t, "parent")
	if grandchild == p.pid() {
		t.Fatal("the ready pid is the parent's")
	}
	// The parent dies of SIGTERM at once; its child ignores SIGTERM and must still go.
	if err := p.stop(10 * time.Second); err != nil {
		t.Fatalf("stop: %v", err)
	}
	waitGone(t, grandchild)
}

func TestWaitUntilReportsExit(t *testing.T) {
	t.Parallel()
	p, _ := startHelper(t, "fail")
	<-p.done
	err := waitUntil(t.Context(), time.Minute, []*process{p}, func(context.Context) error { return errors.New("not yet") })
	if err == nil {
		t.Fatal("waitUntil succeeded")
	}
	for _, want := range []string{"helper exited (exit status 3)", "address already in use", "some output"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}

// A process of the cluster that died during the run (here the log collector, exit
// status 3 before the stop) leaves the logs the summary is read from incomplete. stop
// reported only the processes it had to kill: one that had crashed by itself stopped
// "cleanly", and the summary was computed from partial logs without a word.
func TestClusterStopReportsAnEarlyExit(t *testing.T) {
	t.Parallel()
	collector, _ := startHelper(t, "fail") // exits 3 by itself
	collector.name = "log-collector"
	<-collector.done
	agent, _ := startHelper(t, "obedient") // runs until stopped
	agent.name = agentID(1)
	c := &cluster{log: zerolog.Nop(), collector: collector, agents: []*process{agent}, stopGrace: 10 * time.Second}
	err := c.stop()
	if err == nil || !strings.Contains(err.Error(), "log-collector exited by itself before it was stopped (exit status 3; its stderr: "+collector.stderrPath+")") {
		t.Fatalf("cluster.stop() = %v; want the collector's early exit and its status", err)
	}
	if strings.Contains(err.Error(), agentID(1)) {
		t.Errorf("cluster.stop() = %v; the agent ended on our SIGTERM, as it should", err)
	}
	if exits := c.earlyExits(); len(exits) != 1 {
		t.Errorf("earlyExits = %v, want the collector's only", exits)
	}
	if again := c.stop(); again == nil || again.Error() != err.Error() {
		t.Errorf("second stop: %v, want the first result", again)
	}
}
