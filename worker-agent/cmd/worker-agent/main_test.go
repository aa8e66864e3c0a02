package main

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestMain runs main instead of the tests when a test re-executes this binary.
func TestMain(m *testing.M) {
	if os.Getenv("WORKER_AGENT_RUN_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// A configuration Run refuses exits 2, as a bad flag does; it exited 1, the status of a
// failure at run time.
func TestRefusedConfigExits2(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--slots", "many"}, "flag -slots"},                              // the flag parser's refusal
		{[]string{"--dispatcher-url", "http://x/worker-listen"}, "DispatcherURL"}, // Run's
		{[]string{"--ca-file", "/nonexistent/ca.pem"}, "CAFile"},
	} {
		cmd := exec.CommandContext(t.Context(), os.Args[0], tc.args...)
		cmd.Env = append(os.Environ(), "WORKER_AGENT_RUN_MAIN=1")
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), tc.want) {
			t.Errorf("worker-agent %q: %v, output %q; want exit status 2 naming %s", tc.args, err, out, tc.want)
		}
	}
}
