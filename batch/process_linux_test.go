package batch

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// A second Ctrl-C ends the job at once when its orderly stop hangs (here the last
// checkpoint's write, stuck on a FIFO whose buffer is full, as on a hung disk). It was
// swallowed: the signal handler stayed in place after the first.
func TestSecondInterruptEndsAHungStop(t *testing.T) {
	t.Parallel()
	bin := buildBatch(t)
	f := newFakeDispatcher(t, answerFirstLineOnly)
	cfg := setup(t, f, taskLines(5))
	cp := cfg.Output + ".checkpoint"
	cmd := dieWithTest(exec.Command(bin, "--dispatcher", f.srv.URL, "--input", cfg.Input, "--output", cfg.Output,
		"--checkpoint-interval", "1h", "--concurrency", "1", "--order", "file", "--progress", "false", "--log-level", "error"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	for want := 1; want <= 2; want++ { // line 2 is issued after the start's checkpoint
		select {
		case <-f.arrivedCh:
		case <-time.After(20 * time.Second):
			t.Fatalf("line %d was not issued", want)
		}
	}
	fifo := cp + ".tmp"
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	// Held open as its reader, buffer full: the job's write to it blocks.
	pipe, err := syscall.Open(fifo, syscall.O_RDWR|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(pipe)
	chunk := make([]byte, 4096)
	for {
		if _, err := syscall.Write(pipe, chunk); errors.Is(err, syscall.EAGAIN) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
	}
	// Non-blocking, so that os.File reads it through the poller and a read deadline
	// bounds the wait below.
	inofd, err := syscall.InotifyInit1(syscall.IN_CLOEXEC | syscall.IN_NONBLOCK)
	if err != nil {
		t.Skipf("inotify: %v", err)
	}
	ino := os.NewFile(uintptr(inofd), "inotify")
	defer ino.Close()
	if _, err := syscall.InotifyAddWatch(inofd, filepath.Dir(fifo), syscall.IN_OPEN); err != nil {
		t.Fatal(err)
	}

	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	waitForOpen(t, ino, filepath.Base(fifo)) // the stop is writing the checkpoint, stuck
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || !ee.Sys().(syscall.WaitStatus).Signaled() {
			t.Errorf("exit: %v, want killed by the second SIGINT", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the job is still stuck 20 s after a second Ctrl-C")
	}
}

// waitForOpen reads inotify events from ino until one opens name, failing the test
// after 20 s rather than waiting for the test binary's timeout.
func waitForOpen(t *testing.T, ino *os.File, name string) {
	t.Helper()
	if err := ino.SetReadDeadline(time.Now().Add(20 * time.Second)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	for {
		n, err := ino.Read(buf)
		if err != nil {
			t.Fatalf("waiting for %s to be opened: %v", name, err)
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
