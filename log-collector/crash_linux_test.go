//go:build linux

package logcollector

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	pb "github.com/smartroute/smartroute/proto/smartroutev1"
)

// A collector killed while it writes a brand-new worker's first batch, after the
// batch's lines are appended and fsynced and before state.json is written: the agent
// never got the ack and resends the batch to the restarted collector, which must
// write it once (README: "records are neither lost nor duplicated across collector
// restarts (even SIGKILL)").
//
// The moment is caught without timing: state.json.tmp is a FIFO whose buffer the test
// has filled, so the collector's writeState blocks in its write; inotify reports when
// the collector opens it, and the test then copies the worker's directory, which is
// exactly what a SIGKILL at that moment leaves on disk.
func TestCrashDuringFirstBatchDoesNotDuplicate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	wdir := filepath.Join(dir, "w1")
	if err := os.Mkdir(wdir, 0o755); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(wdir, stateFile+".tmp")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	// Hold the FIFO open (as its reader) and fill its buffer: the collector's write
	// to it blocks until this end is closed.
	pipe, err := syscall.Open(fifo, syscall.O_RDWR|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	pipeOpen := true
	closePipe := func() { // once: a second close of a raw fd closes whatever reused the number
		if pipeOpen {
			pipeOpen = false
			syscall.Close(pipe)
		}
	}
	defer closePipe()
	chunk := make([]byte, 4096)
	for {
		if _, err := syscall.Write(pipe, chunk); errors.Is(err, syscall.EAGAIN) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
	}
	ino, err := syscall.InotifyInit1(syscall.IN_CLOEXEC)
	if err != nil {
		t.Skipf("inotify: %v", err)
	}
	defer syscall.Close(ino)
	if _, err := syscall.InotifyAddWatch(ino, wdir, syscall.IN_OPEN); err != nil {
		t.Fatal(err)
	}

	first := startCollector(t, Config{Dir: dir})
	a, _ := connect(t, first.ingestURL(), "w1", "s1")
	a.send(&pb.LogEnvelope{Body: &pb.LogEnvelope_Batch{Batch: &pb.LogBatch{Seq: 1,
		Records: [][]byte{[]byte(`{"n":1}`), []byte(`{"n":2}`)}}}})
	waitOpen(t, ino, stateFile+".tmp") // the collector is in writeState, stuck on the FIFO

	// The crash: what is on disk now is all a restarted collector finds.
	snap := t.TempDir()
	if err := os.Mkdir(filepath.Join(snap, "w1"), 0o755); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(wdir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !e.Type().IsRegular() || (!strings.HasSuffix(e.Name(), dataSuffix) && e.Name() != stateFile) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(wdir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(snap, "w1", e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	closePipe() // the first collector's write fails; it is not used again
	a.ws.Close()
	first.stop()

	second := startCollector(t, Config{Dir: snap})
	b, last := connect(t, second.ingestURL(), "w1", "s1")
	if last < 1 { // the agent resends what was not acknowledged, as logship does
		b.batch(1, 0, `{"n":1}`, `{"n":2}`)
	}
	if got := lines(t, snap, "w1"); strings.Join(got, " ") != `{"n":1} {"n":2}` {
		t.Fatalf("after the restart the files hold %q, want each record once", got)
	}
}

// waitOpen reads inotify events until one reports that name was opened.
func waitOpen(t *testing.T, ino int, name string) {
	t.Helper()
	buf := make([]byte, 4096)
	for {
		n, err := syscall.Read(ino, buf)
		if err != nil {
			t.Fatal(err)
		}
		for off := 0; off+syscall.SizeofInotifyEvent <= n; {
			nameLen := int(binary.NativeEndian.Uint32(buf[off+12:])) // InotifyEvent.Len
			start := off + syscall.SizeofInotifyEvent
			if string(bytes.TrimRight(buf[start:start+nameLen], "\x00")) == name {
				return
			}
			off = start + nameLen
		}
	}
}
