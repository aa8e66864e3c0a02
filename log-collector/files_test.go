package logcollector

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/smartroute/smartroute/worker-agent/logship"
)

// openFilesUnder counts this process's open file descriptors on files under dir.
func openFilesUnder(t *testing.T, dir string) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	n := 0
	for _, fd := range fds {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name()))
		if err == nil && strings.HasPrefix(target, dir+string(filepath.Separator)) {
			n++
		}
	}
	return n
}

// Agents come and go (every pod, every restart has a new worker id). Once an agent's
// stream has ended, the collector must not keep that worker's data file open: a
// long-running collector would otherwise hold one descriptor per worker id it has ever
// seen, until it runs out of them.
func TestEndedStreamsReleaseTheirFiles(t *testing.T) {
	t.Parallel()
	r := startCollector(t, Config{})
	const agents = 20
	for i := range agents {
		s, err := logship.New(logship.Config{URL: r.ingestURL(), WorkerID: fmt.Sprintf("w%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(s, `{"level":"info","message":"hello from agent %d"}`+"\n", i)
		if err := s.Close(); err != nil { // acknowledged, then a normal close: the agent is gone
			t.Fatalf("shipper %d: %v", i, err)
		}
	}
	r.c.handlers.Wait() // every stream's handler has returned
	if n := openFilesUnder(t, r.dir); n != 0 {
		t.Fatalf("%d files under the log directory still open after all %d streams ended", n, agents)
	}
}
