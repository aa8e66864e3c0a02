package main

import (
	"bufio"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/smartroute/smartroute/dispatcher"
)

// An empty variable counts as unset, as in the agent and the collector: MAX_QUEUED= must not
// stop the start and DATA_DIR= must not turn the journal off.
func TestFromEnvTreatsEmptyAsUnset(t *testing.T) {
	fs := flag.NewFlagSet("dispatcher", flag.ContinueOnError)
	maxQueued := fs.Int("max-queued", 100_000, "")
	dataDir := fs.String("data-dir", "./data", "")
	logLevel := fs.String("log-level", "info", "")
	policy := fs.String("policy", "affinity", "")
	if err := fs.Parse([]string{"--policy=random"}); err != nil {
		t.Fatal(err)
	}
	t.Setenv("MAX_QUEUED", "")
	t.Setenv("DATA_DIR", "")
	t.Setenv("LOG_LEVEL", "debug")
	t.Setenv("POLICY", "affinity")
	if err := fromEnv(fs); err != nil {
		t.Fatalf("fromEnv with empty variables: %v", err)
	}
	if *maxQueued != 100_000 || *dataDir != "./data" {
		t.Errorf("empty variables applied: max-queued %d, data-dir %q; want the defaults", *maxQueued, *dataDir)
	}
	if *logLevel != "debug" {
		t.Errorf("log-level = %q, want LOG_LEVEL's debug", *logLevel)
	}
	if *policy != "random" {
		t.Errorf("policy = %q, want the command line's random over POLICY", *policy)
	}

	t.Setenv("MAX_QUEUED", "lots")
	if err := fromEnv(fs); err == nil || !strings.Contains(err.Error(), "MAX_QUEUED") {
		t.Errorf("fromEnv with MAX_QUEUED=lots: %v, want an error naming MAX_QUEUED", err)
	}
}

// helpChildEnv makes the test binary run main with --help instead of the tests.
const helpChildEnv = "SMARTROUTE_TEST_DISPATCHER_HELP"

// --help prints every flag with its environment variable and exits 0, as the other
// commands do. main runs in a child process because it calls os.Exit.
func TestHelpExitsZeroAndNamesEnvVars(t *testing.T) {
	if os.Getenv(helpChildEnv) == "1" {
		os.Args = []string{"dispatcher", "--help"}
		main()
		os.Exit(3) // main returned without exiting: neither 0 nor its error exit
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelpExitsZeroAndNamesEnvVars$")
	cmd.Env = append(os.Environ(), helpChildEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("dispatcher --help: %v, want exit 0\n%s", err, out)
	}
	for _, want := range []string{"-max-queued", "(env MAX_QUEUED)", "(env DATA_DIR)", "(env OPS_AUTH)"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("usage lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(string(out), "help requested") {
		t.Errorf("usage reports --help as an error:\n%s", out)
	}
}

// A stray argument (a flag without its dashes) stops the start instead of being
// ignored, as in the other commands.
func TestUnexpectedArgumentsRefused(t *testing.T) {
	err := run([]string{"--addr", "127.0.0.1:0", "random-dispatch"})
	if err == nil || !strings.Contains(err.Error(), `unexpected arguments: ["random-dispatch"]`) {
		t.Fatalf("run with a stray argument: %v", err)
	}
}

// Zero is the library's "default" for these flags; on the command line or in the
// environment it is refused, not quietly replaced by 30s or 10m.
func TestZeroThatWouldMeanTheDefaultIsRefused(t *testing.T) {
	for _, args := range [][]string{
		{"--label-failure-cooldown", "0"}, {"--fleet-settle", "0s"}, {"--task-retention=0s"}, {"--max-queued", "0"}, {"--task-retention-bytes", "0"},
		{"--body-read-timeout", "0"}, {"--idle-timeout=0s"}, {"--max-delay-slack", "0s"},
	} {
		err := run(append([]string{"--addr", "127.0.0.1:0"}, args...))
		if err == nil || !strings.Contains(err.Error(), "must be more than 0") {
			t.Errorf("%q: %v", args, err)
		}
	}
	t.Setenv("SHUTDOWN_TIMEOUT", "0s")
	if err := run([]string{"--addr", "127.0.0.1:0"}); err == nil || !strings.Contains(err.Error(), "--shutdown-timeout (SHUTDOWN_TIMEOUT)") {
		t.Errorf("SHUTDOWN_TIMEOUT=0s: %v", err)
	}
}

// A configuration the dispatcher cannot start with exits 2, as the worker agent and
// the batch job do; a failure at run time (here the address already taken) exits 1.
func TestBadConfigurationExitsTwo(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for _, c := range []struct {
		args []string
		want int
	}{
		{[]string{"--no-such-flag"}, 2},
		{[]string{"--max-queued", "0"}, 2},
		{[]string{"--log-level", "loud"}, 2},
		{[]string{"--log-level", ""}, 2}, // NoLevel: the log silently off
		{[]string{"--memory-limit-ratio", "2"}, 2},
		{[]string{"--max-attempts", "-1"}, 2},      // dispatcher.New's validation
		{[]string{"--max-frame-bytes", "4096"}, 2}, // below a result's floor
		{[]string{"--pass-over-loads", "NaN"}, 2},
		{[]string{"--pass-over-loads", "+Inf"}, 2},
		{[]string{"--pass-over-loads", "1e30"}, 2},                                // × a load overflows a duration
		{[]string{"--worker-tokens-file", filepath.Join(t.TempDir(), "none")}, 2}, // an unreadable token file
		{[]string{"--addr", busy.Addr().String()}, 1},
	} {
		args := c.args
		if c.args[0] != "--addr" {
			args = append([]string{"--addr", "127.0.0.1:0"}, args...)
		}
		err := run(append(args, "--data-dir", t.TempDir()))
		if err == nil {
			t.Fatalf("%q: started", c.args)
		}
		if got := exitCode(err); got != c.want {
			t.Errorf("%q: exit %d, want %d (%v)", c.args, got, c.want, err)
		}
	}
}

// --pass-over-loads that is not a finite number, or that times a load overflows a
// duration, is refused with an error naming the flag (the bound wrapped and silently
// fell to --max-pass-over); from the environment too.
func TestPassOverLoadsMustBeFinite(t *testing.T) {
	for _, v := range []string{"NaN", "+Inf", "-Inf", "1e30"} {
		err := run([]string{"--addr", "127.0.0.1:0", "--data-dir", t.TempDir(), "--pass-over-loads", v})
		if err == nil || exitCode(err) != 2 || !strings.Contains(err.Error(), "--pass-over-loads (PASS_OVER_LOADS)") {
			t.Errorf("--pass-over-loads %s: %v, want exit 2 naming the flag", v, err)
		}
	}
	t.Setenv("PASS_OVER_LOADS", "nan")
	if err := run([]string{"--addr", "127.0.0.1:0", "--data-dir", t.TempDir()}); err == nil || !strings.Contains(err.Error(), "PASS_OVER_LOADS") {
		t.Errorf("PASS_OVER_LOADS=nan: %v", err)
	}
}

// --random-dispatch is the seed's switch for what --policy random says. The command line
// wins over the environment for the pair as for any flag (RANDOM_DISPATCH=true left in an
// env file had silently overridden --policy affinity), and the two given at the same level
// with different answers are refused rather than one quietly chosen.
func TestPolicyAndRandomDispatchPrecedence(t *testing.T) {
	for _, c := range []struct {
		args        []string
		env         map[string]string
		want        string
		wantRefused bool
	}{
		{nil, nil, "affinity", false},
		{[]string{"--random-dispatch"}, nil, "random", false},
		{[]string{"--policy", "random"}, nil, "random", false},
		{nil, map[string]string{"RANDOM_DISPATCH": "true"}, "random", false},
		{[]string{"--policy", "affinity"}, map[string]string{"RANDOM_DISPATCH": "true"}, "affinity", false},
		{[]string{"--random-dispatch"}, map[string]string{"POLICY": "affinity"}, "random", false},
		{nil, map[string]string{"RANDOM_DISPATCH": "true", "POLICY": "random"}, "random", false},
		{[]string{"--random-dispatch", "--policy", "random"}, nil, "random", false},
		{[]string{"--random-dispatch=false"}, map[string]string{"POLICY": "random"}, "random", false},
		{[]string{"--random-dispatch", "--policy", "affinity"}, nil, "", true},
		{nil, map[string]string{"RANDOM_DISPATCH": "true", "POLICY": "affinity"}, "", true},
	} {
		t.Run(strings.Join(c.args, " ")+fmt.Sprint(c.env), func(t *testing.T) {
			for _, name := range []string{"RANDOM_DISPATCH", "POLICY"} {
				t.Setenv(name, c.env[name])
			}
			fs := flag.NewFlagSet("dispatcher", flag.ContinueOnError)
			random := fs.Bool("random-dispatch", false, "")
			policy := fs.String("policy", "affinity", "")
			if err := fs.Parse(c.args); err != nil {
				t.Fatal(err)
			}
			if err := fromEnv(fs); err != nil {
				t.Fatal(err)
			}
			got, err := resolvePolicy(fs, *random, *policy)
			if c.wantRefused {
				if err == nil || !strings.Contains(err.Error(), "--random-dispatch") || !strings.Contains(err.Error(), "--policy") {
					t.Fatalf("policy %q, err %v; want a refusal naming both flags", got, err)
				}
				return
			}
			if err != nil || string(got) != c.want {
				t.Fatalf("policy %q, err %v; want %q", got, err, c.want)
			}
		})
	}
}

const lockedChildEnv = "SMARTROUTE_TEST_DISPATCHER_LOCKED_DIR"

// SIGTERM while the dispatcher waits for its journal's lock (a previous pod still
// holds it; the chart waits up to a minute) ends it with exit 0 and a log line, as any
// shutdown does; before, the signal killed it (exit 143) with nothing said.
func TestSIGTERMWhileStartingExitsZero(t *testing.T) {
	if dir := os.Getenv(lockedChildEnv); dir != "" {
		os.Args = []string{"dispatcher", "--addr", "127.0.0.1:0", "--data-dir", dir, "--journal-lock-timeout", "10m"}
		main()
		os.Exit(0)
	}
	dir := t.TempDir()
	holder, err := dispatcher.New(dispatcher.Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestSIGTERMWhileStartingExitsZero$")
	cmd.Env = append(os.Environ(), lockedChildEnv+"="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	sc := bufio.NewScanner(out)
	var lines []string
	for sc.Scan() { // signals are caught before this line is logged
		lines = append(lines, sc.Text())
		if strings.Contains(sc.Text(), `"garbage collector"`) {
			break
		}
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("SIGTERM while waiting for the journal's lock: %v, want exit 0\n%s", err, strings.Join(lines, "\n"))
	}
	if !strings.Contains(strings.Join(lines, "\n"), "stopped while starting") {
		t.Errorf("no log of the stop:\n%s", strings.Join(lines, "\n"))
	}
}
