package live

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"testing"
)

// helperEnv makes the test binary act as a child process for the process tests.
const helperEnv = "LIVE_TEST_HELPER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(helper(mode))
	}
	os.Exit(m.Run())
}

// helper is the child side of the process tests. LIVE_TEST_FIFO names a FIFO the
// child writes "ready <pid>" to once it is set up, so the test blocks on a read
// instead of sleeping.
func helper(mode string) int {
	ready := func() {
		f, err := os.OpenFile(os.Getenv("LIVE_TEST_FIFO"), os.O_WRONLY, 0)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(9)
		}
		fmt.Fprintf(f, "ready %d\n", os.Getpid())
		f.Close()
	}
	switch mode {
	case "obedient": // dies of the default SIGTERM
		ready()
		select {}
	case "stubborn": // ignores SIGTERM
		signal.Ignore(syscall.SIGTERM)
		ready()
		select {}
	case "parent": // starts a stubborn child in its own group, then waits to die
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), helperEnv+"=stubborn")
		if err := cmd.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 9
		}
		select {}
	case "fail":
		fmt.Fprintln(os.Stdout, "some output")
		fmt.Fprintln(os.Stderr, "fatal: cannot bind 127.0.0.1:1: address already in use")
		return 3
	}
	return 8
}
