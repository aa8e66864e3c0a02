package logcollector

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gorilla/websocket"

	pb "github.com/smartroute/smartroute/proto/smartroutev1"
)

// A batch that failed and could not be cut off either (its truncate failed too) leaves
// bytes past the acknowledged size. The next batch cuts them off before it is
// appended: after them it would lie beyond what state.json records, unread by queries
// and cut off by the next restart although acknowledged.
func TestBatchAfterAnUncutFailedBatchStartsAtTheAcknowledgedSize(t *testing.T) {
	st, err := newStore(t.TempDir(), 1<<20, 3)
	if err != nil {
		t.Fatal(err)
	}
	w, err := st.worker("w1")
	if err != nil {
		t.Fatal(err)
	}
	first, second := []byte(`{"n":1}`+"\n"), []byte(`{"n":2}`+"\n")
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, err := w.appendBatch(rawLines(first), 1, 0, 1, 1<<20, 3); err != nil {
		t.Fatal(err)
	}
	// What a failed batch whose cut also failed leaves: its bytes, and the file closed.
	path := w.dataPath(w.state.File)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte(`{"n":"par`)); err != nil {
		t.Fatal(err)
	}
	f.Close()
	w.file.Close()
	w.file = nil

	if _, err := w.appendBatch(rawLines(second), 2, 0, 1, 1<<20, 3); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if want := string(first) + string(second); string(got) != want || w.state.Size != int64(len(want)) {
		t.Fatalf("file %q (state size %d), want %q", got, w.state.Size, want)
	}
}

// The same when the resent batch rotates the file: the rotated-out file is no longer
// current, so queries read it whole and a restart no longer cuts it; its failed tail
// must be cut off before the rotation, or the resent batch is stored twice.
func TestUncutFailedBatchIsCutBeforeARotation(t *testing.T) {
	dir := t.TempDir()
	const maxFile = 40
	st, err := newStore(dir, maxFile, 10)
	if err != nil {
		t.Fatal(err)
	}
	w, err := st.worker("w1")
	if err != nil {
		t.Fatal(err)
	}
	first := []byte(`{"n":1,"pad":"xxxxxxxxxx"}` + "\n")  // 27 bytes
	second := []byte(`{"n":2,"pad":"yyyyyyyyyy"}` + "\n") // 27 bytes: 27+27 > 40, rotates
	w.mu.Lock()
	if _, err := w.appendBatch(rawLines(first), 1, 0, 1, maxFile, 10); err != nil {
		t.Fatal(err)
	}
	// What a failed batch 2 whose cut also failed leaves (its fsync or state write
	// failed, then its Truncate): its whole lines, and the file closed
	// (as in TestBatchAfterAnUncutFailedBatchStartsAtTheAcknowledgedSize).
	path := w.dataPath(w.state.File)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(second); err != nil {
		t.Fatal(err)
	}
	f.Close()
	w.file.Close()
	w.file = nil
	// The agent resends batch 2 (never acknowledged); it does not fit: rotation.
	if _, err := w.appendBatch(rawLines(second), 2, 0, 1, maxFile, 10); err != nil {
		t.Fatal(err)
	}
	w.mu.Unlock()

	count := func(w *workerLog) int {
		n := 0
		if err := w.scan(context.Background(), func(line []byte) {
			if string(line)+"\n" == string(second) {
				n++
			}
		}); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := count(w); n != 1 {
		t.Errorf("live: the query reads batch 2's record %d times, want once (rotated-out file %s keeps the unacknowledged copy)", n, path)
	}
	// A restart does not cut it either.
	st2, err := newStore(dir, maxFile, 10)
	if err != nil {
		t.Fatal(err)
	}
	w2, err := st2.worker("w1")
	if err != nil {
		t.Fatal(err)
	}
	if n := count(w2); n != 1 {
		t.Errorf("after a restart: batch 2's record is read %d times, want once", n)
	}
	st.close()
	st2.close()
}

// failDirSync makes the directory fsyncs of worker id's store fail, with EIO, until
// the flag it returns is cleared.
func failDirSync(t *testing.T, r *running, id string) *atomic.Bool {
	t.Helper()
	w, err := r.c.store.worker(id)
	if err != nil {
		t.Fatal(err)
	}
	failing := new(atomic.Bool)
	failing.Store(true)
	w.mu.Lock()
	w.syncDir = func(dir string) error {
		if failing.Load() {
			return errors.New("input/output error")
		}
		return syncDir(dir)
	}
	w.mu.Unlock()
	return failing
}

// When state.json was renamed into place but the directory's fsync failed, a power cut
// could bring the old state back: the batch's resend must not be acknowledged, nor a
// welcome tell the agent it may forget that seq, until a directory fsync works.
func TestUnsyncedStateRenameIsNotVouchedFor(t *testing.T) {
	t.Parallel()
	r := startCollector(t, Config{})
	a, _ := connect(t, r.ingestURL(), "w1", "s1")
	a.batch(1, 0, `{"n":1}`)
	failing := failDirSync(t, r, "w1")
	a.send(&pb.LogEnvelope{Body: &pb.LogEnvelope_Batch{Batch: &pb.LogBatch{Seq: 2, Records: [][]byte{[]byte(`{"n":2}`)}}}})
	if code := a.closeCode(); code != websocket.CloseInternalServerErr {
		t.Fatalf("batch 2 with the directory fsync failing: close code %d, want %d", code, websocket.CloseInternalServerErr)
	}
	// The agent reconnects to resend batch 2: no welcome may claim it yet.
	b, _, err := dialIngest(t, r.ingestURL(), "w1")
	if err != nil {
		t.Fatal(err)
	}
	b.send(&pb.LogEnvelope{Body: &pb.LogEnvelope_Hello{Hello: &pb.LogHello{
		ProtocolVersion: pb.LogProtocolVersion_LOG_PROTOCOL_VERSION_CURRENT, WorkerId: "w1", StreamId: "s1"}}})
	if env, err := b.read(); err == nil {
		t.Fatalf("welcome %v while state.json's rename is not durable, want the stream closed", env)
	}
	failing.Store(false)
	if _, last := connect(t, r.ingestURL(), "w1", "s1"); last != 2 {
		t.Fatalf("welcome last_seq %d once the directory fsync works, want 2", last)
	}
}

// A worker's directory entry is made durable (the logs directory fsynced) before
// anything in it is acknowledged; when that fsync fails, the worker is not opened for
// writing, and the next try fsyncs again, although the directory now exists.
func TestNewWorkerDirectoryIsMadeDurable(t *testing.T) {
	t.Parallel()
	st, err := newStore(t.TempDir(), 1<<20, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer st.close()
	var synced []string
	fail := true
	st.syncDir = func(dir string) error {
		synced = append(synced, dir)
		if fail {
			return errors.New("input/output error")
		}
		return nil
	}
	if _, err := st.existing("w1"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.worker("w1"); err == nil || !strings.Contains(err.Error(), "input/output error") {
		t.Fatalf("worker with the logs directory's fsync failing: %v, want its error", err)
	}
	fail = false
	if _, err := st.worker("w1"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.worker("w1"); err != nil {
		t.Fatal(err)
	}
	if len(synced) != 2 || synced[0] != st.dir || synced[1] != st.dir {
		t.Fatalf("fsynced %q, want the logs directory %s twice (the failed try and the next), then no more", synced, st.dir)
	}
}
