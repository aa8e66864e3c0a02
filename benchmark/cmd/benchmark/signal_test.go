//go:build unix

package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// signalHelperEnv makes the test binary act as the child of TestSecondInterruptKills.
const signalHelperEnv = "BENCHMARK_TEST_SIGNAL_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(signalHelperEnv) != "" {
		os.Exit(signalHelper())
	}
	os.Exit(m.Run())
}

// signalHelper waits for its interrupt, then for an orderly stop that never ends.
func signalHelper() int {
	ctx, stop := interruptContext(context.Background())
	defer stop()
	fmt.Println("ready")
	<-ctx.Done()
	fmt.Println("interrupted")
	select {} // a stop that hangs: a stuck dispatcher, a process that will not exit
}

// The first Ctrl-C stops the run in order; a second one must end it at once, should
// that stop hang. With signal.NotifyContext the second one was caught and dropped.
func TestSecondInterruptKills(t *testing.T) {
	t.Parallel()
	// The bound only turns a hang into a failure (the child is then SIGKILLed).
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), signalHelperEnv+"=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(out)
	expect := func(want string) {
		t.Helper()
		if !lines.Scan() || lines.Text() != want {
			t.Fatalf("child said %q (%v), want %q", lines.Text(), lines.Err(), want)
		}
	}
	expect("ready")
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	expect("interrupted") // the first one cancelled the context and did not kill
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGINT {
		t.Errorf("child ended with %v (%v), want killed by the second SIGINT", cmd.ProcessState, err)
	}
}
