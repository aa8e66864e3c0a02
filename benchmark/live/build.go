package live

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"time"
)

// binaries are the programs a run starts.
type binaries struct {
	dispatcher, agent, collector string
	// fakeTriton stands in for Triton beside each agent with --backend triton.
	fakeTriton string
}

// Packages built for a run, relative to the repository root.
const (
	dispatcherPkg = "./dispatcher/cmd/dispatcher"
	agentPkg      = "./worker-agent/cmd/worker-agent"
	collectorPkg  = "./log-collector/cmd/log-collector"
	fakeTritonPkg = "./worker-agent/cmd/fake-triton"
)

func exe(name string) string {
	if runtime.GOOS == "windows" {
		return name + ".exe"
	}
	return name
}

func binariesIn(dir string) binaries {
	return binaries{
		dispatcher: filepath.Join(dir, exe("dispatcher")),
		agent:      filepath.Join(dir, exe("worker-agent")),
		collector:  filepath.Join(dir, exe("log-collector")),
		fakeTriton: filepath.Join(dir, exe("fake-triton")),
	}
}

// FindRepoRoot walks up from start to the first directory holding go.work.
func FindRepoRoot(start string) (string, error) {
	dir, err := filepath.Abs(start)
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.work at or above %s: run from the repository or pass --repo", start)
		}
		dir = parent
	}
}

// Build compiles the dispatcher and the worker agent of the repository at repo into
// dir. A failure carries the compiler's output.
func Build(ctx context.Context, repo, dir string) (binaries, error) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		return binaries{}, fmt.Errorf("building needs the go tool on PATH (or pass --bin-dir): %w", err)
	}
	cmd := exec.CommandContext(ctx, goTool, "build", "-o", dir+string(filepath.Separator), dispatcherPkg, agentPkg, collectorPkg, fakeTritonPkg)
	cmd.Dir = repo
	// The go tool starts compilers; a cancelled build takes its whole group down.
	cmd.SysProcAttr = sysProcAttr()
	cmd.Cancel = func() error { return killGroup(cmd.Process) }
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return binaries{}, fmt.Errorf("go build %s %s %s %s in %s: %w\n%s", dispatcherPkg, agentPkg, collectorPkg, fakeTritonPkg, repo, err, out)
	}
	return binariesIn(dir), nil
}

// prebuilt checks that dir holds every binary the backend needs.
func prebuilt(dir, backend string) (binaries, error) {
	b := binariesIn(dir)
	// One error for a directory that is not there, rather than one per binary.
	if fi, err := os.Stat(dir); err != nil {
		return b, fmt.Errorf("--bin-dir: %w", err)
	} else if !fi.IsDir() {
		return b, fmt.Errorf("--bin-dir: %s is not a directory", dir)
	}
	var errs []error
	need := []string{b.dispatcher, b.agent, b.collector}
	if backend == BackendTriton {
		need = append(need, b.fakeTriton)
	}
	for _, p := range need {
		fi, err := os.Stat(p)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("--bin-dir: %w", err))
		case fi.IsDir() || (runtime.GOOS != "windows" && fi.Mode().Perm()&0o111 == 0):
			errs = append(errs, fmt.Errorf("--bin-dir: %s is not an executable file", p))
		}
	}
	return b, errors.Join(errs...)
}
