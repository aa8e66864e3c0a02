package live

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// process is a child started by the benchmark, in a process group of its own so that
// a signal reaches everything it started and the terminal's Ctrl-C reaches only us.
type process struct {
	name       string
	cmd        *exec.Cmd
	stdoutPath string
	stderrPath string

	done    chan struct{} // closed by the wait goroutine once cmd.Wait has returned
	waitErr error         // written by the wait goroutine before done is closed

	stopOnce sync.Once
	stopErr  error // written inside stopOnce
	// endedEarly is written inside stopOnce: the process had ended by itself before
	// stop was called.
	endedEarly bool
}

// killWait bounds the wait for a process after SIGKILL; only a process stuck in the
// kernel outlives it.
const killWait = 5 * time.Second

// startProcess starts bin with args and env, its stdout and stderr going to
// <dir>/<name>.log and <dir>/<name>.stderr.log.
func startProcess(name, bin string, args, env []string, dir string) (*process, error) {
	p := &process{
		name:       name,
		stdoutPath: filepath.Join(dir, name+".log"),
		stderrPath: filepath.Join(dir, name+".stderr.log"),
		done:       make(chan struct{}),
	}
	stdout, err := os.Create(p.stdoutPath)
	if err != nil {
		return nil, err
	}
	defer stdout.Close() // the child holds its own descriptor
	stderr, err := os.Create(p.stderrPath)
	if err != nil {
		return nil, err
	}
	defer stderr.Close()

	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = env
	p.cmd.Stdout = stdout // an *os.File goes to the child as is: no copying goroutine
	p.cmd.Stderr = stderr
	p.cmd.SysProcAttr = sysProcAttr()
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	go func() {
		p.waitErr = p.cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *process) pid() int { return p.cmd.Process.Pid }

// exited reports whether the process has ended.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop ends the process group: SIGTERM, then SIGKILL if the process is still there
// after grace. Whatever is left of its group is killed once the process is gone. It
// returns once the process has been reaped (or killWait after SIGKILL); calling it
// again returns the first result. Its error says what had to be killed; a process
// that had ended by itself before is told by earlyExit.
func (p *process) stop(grace time.Duration) error {
	p.stopOnce.Do(func() {
		p.endedEarly = p.exited()
		if !p.endedEarly {
			if err := terminateGroup(p.cmd.Process); err != nil {
				p.stopErr = fmt.Errorf("SIGTERM to %s: %w", p.name, err)
			}
			t := time.NewTimer(grace)
			select {
			case <-p.done:
				t.Stop()
			case <-t.C:
				p.stopErr = fmt.Errorf("%s did not exit within %v of SIGTERM; killed", p.name, grace)
				if err := killGroup(p.cmd.Process); err != nil {
					p.stopErr = errors.Join(p.stopErr, err)
				}
				select {
				case <-p.done:
				case <-time.After(killWait):
					p.stopErr = fmt.Errorf("%s (pid %d) did not exit after SIGKILL", p.name, p.pid())
				}
			}
		}
		// Stragglers the process left in its group.
		if err := killGroup(p.cmd.Process); err != nil {
			p.stopErr = errors.Join(p.stopErr, err)
		}
	})
	return p.stopErr
}

// earlyExit, once stop has returned, is an error saying how the process ended when it
// had ended by itself before stop was called, and nil otherwise. The processes of a
// cluster are servers that run until stopped: for them, that is a crash during the
// run (even with status 0), and their logs may be incomplete.
func (p *process) earlyExit() error {
	if !p.endedEarly {
		return nil
	}
	status := "exit status 0"
	if p.waitErr != nil {
		status = p.waitErr.Error()
	}
	return fmt.Errorf("%s exited by itself before it was stopped (%s; its stderr: %s)", p.name, status, p.stderrPath)
}

// describeExit says how an exited process ended, with the end of its output.
func (p *process) describeExit() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s exited", p.name)
	if p.waitErr != nil {
		fmt.Fprintf(&b, " (%v)", p.waitErr)
	} else {
		b.WriteString(" (status 0)")
	}
	for _, path := range []string{p.stderrPath, p.stdoutPath} {
		if tail := tailLines(path, 15); tail != "" {
			fmt.Fprintf(&b, "\n--- last lines of %s:\n%s", path, tail)
		}
	}
	return b.String()
}

// tailLines is the last n lines of the file at path, or "" when it is empty or
// unreadable.
func tailLines(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	b = bytes.TrimRight(b, "\n")
	lines := bytes.Split(b, []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// childEnvKeep are the variables the started processes inherit. Both programs read
// their configuration from the environment as well as from flags (RANDOM_DISPATCH,
// POLICY, LABELS, LOG_LEVEL...), so everything else is left out: the flags the
// benchmark passes are the whole configuration, whatever the caller's shell holds.
var childEnvKeep = []string{
	"PATH", "HOME", "USER", "TMPDIR", "TZ", "LANG", "LC_ALL",
	"GODEBUG", "GOMAXPROCS", "GOTRACEBACK", "GOGC", "GOMEMLIMIT",
	"SYSTEMROOT", // Windows needs it to start anything
}

// childEnv is the environment of the started processes.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if slices.Contains(childEnvKeep, name) {
			env = append(env, kv)
		}
	}
	return env
}
