// Package e2e runs the real dispatcher and worker-agent binaries as processes on
// loopback and checks what a producer sees. Nothing here is faked: real processes,
// real WebSockets, real signals (SIGTERM, SIGKILL).
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// binDirPrefix names the temp dirs the binaries are built in; claimedMarker, in one,
// says a test binary holds its lock (see claimBinDir).
const binDirPrefix, claimedMarker = "smartroute-e2e-", ".claimed"

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// binaries builds the dispatcher, the agent, the fake Triton and the log collector once per test run.
func binaries(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end tests build and start real processes; skipped with -short")
	}
	buildOnce.Do(func() {
		removeStaleBinDirs()
		binDir, buildErr = os.MkdirTemp("", binDirPrefix)
		if buildErr != nil {
			return
		}
		if buildErr = claimBinDir(binDir); buildErr != nil {
			return
		}
		cmd := exec.Command("go", "build", "-o", binDir+"/", "./dispatcher/cmd/dispatcher", "./worker-agent/cmd/worker-agent", "./worker-agent/cmd/fake-triton", "./log-collector/cmd/log-collector")
		cmd.Dir = ".."
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir
}

// TestMain removes the binaries when the tests end; a test binary that dies first
// (a -timeout panic) leaves them to the next run's removeStaleBinDirs.
func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// proc is a started binary whose output goes to a file in the test's temp dir.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
	log  string
}

func start(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := dieWithTest(exec.Command(filepath.Join(binaries(t), strings.SplitN(name, "#", 2)[0]), args...))
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{}), log: logPath}
	go func() { p.err = cmd.Wait(); f.Close(); close(p.done) }()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("--- %s output:\n%s", name, tail(string(b), 4000))
		}
	})
	return p
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

func (p *proc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %s: %v", p.name, err)
	}
}

func (p *proc) wait(t *testing.T, within time.Duration) error {
	t.Helper()
	select {
	case <-p.done:
		return p.err
	case <-time.After(within):
		t.Fatalf("%s did not exit within %v", p.name, within)
		return nil
	}
}

// loggedAddr waits, up to 20 s, for p to log the address it listens on and returns it;
// addrIn picks the address out of a log line ("" for any other line). A process
// started on 127.0.0.1:0 picks a free port itself, where one picked by the test and
// handed over could be taken by another process in between.
func loggedAddr(t *testing.T, p *proc, addrIn func(line []byte) string) string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		b, err := os.ReadFile(p.log)
		if err != nil {
			t.Fatal(err)
		}
		for line := range bytes.SplitSeq(b, []byte("\n")) {
			if addr := addrIn(line); addr != "" {
				return addr
			}
		}
		select {
		case <-p.done:
			t.Fatalf("%s exited (%v) before it logged its address", p.name, p.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not log its address within 20 s", p.name)
		}
		time.Sleep(10 * time.Millisecond) // polling the log file, as eventually polls
	}
}

// jsonAddr picks the addr field out of the JSON log record whose message is msg.
func jsonAddr(msg string) func([]byte) string {
	return func(line []byte) string {
		var rec struct {
			Message string `json:"message"`
			Addr    string `json:"addr"`
		}
		if json.Unmarshal(line, &rec) != nil || rec.Message != msg {
			return ""
		}
		return rec.Addr
	}
}

// stack is a dispatcher and its agents.
type stack struct {
	t       *testing.T
	addr    string
	dataDir string // the dispatcher's journal, kept across its restarts
	disp    *proc
	agents  map[string]*proc
}

type stackOpts struct {
	workers        int
	random         bool
	loadTime       time.Duration
	runTime        time.Duration
	dispatcherArgs []string
}

func startStack(t *testing.T, o stackOpts) *stack {
	t.Helper()
	s := &stack{t: t, agents: map[string]*proc{}}
	s.startDispatcher(o)
	for i := 1; i <= o.workers; i++ {
		s.startAgent(fmt.Sprintf("agent-%d", i), o)
	}
	s.waitWorkers(o.workers)
	return s
}

// startDispatcher starts the dispatcher: the first time on a port of its choosing,
// which becomes s.addr; again (a restart) on s.addr, where the agents reconnect.
func (s *stack) startDispatcher(o stackOpts) {
	s.t.Helper()
	if s.dataDir == "" {
		s.dataDir = s.t.TempDir()
	}
	addr := s.addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	args := append([]string{"--addr", addr, "--log-level", "debug", "--shutdown-timeout", "10s", "--data-dir", s.dataDir}, o.dispatcherArgs...)
	if o.random {
		args = append(args, "--random-dispatch")
	}
	s.disp = start(s.t, "dispatcher", args...)
	if s.addr == "" {
		s.addr = loggedAddr(s.t, s.disp, jsonAddr("dispatcher listening"))
	}
	s.eventually("dispatcher healthy", func() bool {
		resp, err := http.Get("http://" + s.addr + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
}

func (s *stack) startAgent(id string, o stackOpts) {
	s.agents[id] = start(s.t, "worker-agent#"+id,
		"--dispatcher-url", "ws://"+s.addr+"/worker-listen", "--worker-id", id,
		"--max-labels", "2", "--sim-load-time", o.loadTime.String(), "--sim-run-time", o.runTime.String())
}

// eventually polls an observable condition; the poll interval is not a synchronisation
// assumption, only how often we look.
func (s *stack) eventually(what string, cond func() bool) {
	s.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			s.t.Fatalf("timed out waiting for: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (s *stack) workers() []string {
	var out struct{ Workers []string }
	if code := s.getJSON("/workers", &out); code != 200 {
		return nil
	}
	return out.Workers
}

func (s *stack) waitWorkers(n int) {
	s.t.Helper()
	s.eventually(fmt.Sprintf("%d workers connected", n), func() bool { return len(s.workers()) == n })
}

func (s *stack) getJSON(path string, v any) int {
	resp, err := http.Get("http://" + s.addr + path)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	_ = json.NewDecoder(resp.Body).Decode(v)
	return resp.StatusCode
}

type taskAnswer struct {
	TaskID    string          `json:"task_id"`
	Status    string          `json:"status"`
	WorkerID  string          `json:"worker_id"`
	LabelMiss bool            `json:"label_miss"`
	Attempts  int             `json:"attempts"`
	Result    json.RawMessage `json:"result"`
	Error     string          `json:"error"`
}

// post submits a task and returns the answer, bounded by 30 s. It returns an error
// rather than failing the test, so that it may run on a goroutine of its own.
func (s *stack) post(body string) (int, taskAnswer, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code, a, err := postTask(ctx, s.addr, body)
	if err != nil {
		err = fmt.Errorf("POST /run-task: %w", err)
	}
	return code, a, err
}

// run is post on the test's goroutine: an error fails the test.
func (s *stack) run(body string) (int, taskAnswer) {
	s.t.Helper()
	code, a, err := s.post(body)
	if err != nil {
		s.t.Fatal(err)
	}
	return code, a
}

func task(id, label string, extra string) string {
	b := fmt.Sprintf(`{"task_id":%q,"task_type":"sample_task","label":%q,"parameters_json":"{\"data\": \"sample\"}"`, id, label)
	if extra != "" {
		b += "," + extra
	}
	return b + "}"
}

// grepLog counts the JSON log lines of a process that carry all the given fragments.
func grepLog(t *testing.T, p *proc, fragments ...string) int {
	t.Helper()
	b, err := os.ReadFile(p.log)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range bytes.Split(b, []byte("\n")) {
		ok := len(line) > 0
		for _, f := range fragments {
			ok = ok && bytes.Contains(line, []byte(f))
		}
		if ok {
			n++
		}
	}
	return n
}
