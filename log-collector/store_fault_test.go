package logcollector

import (
	"os"
	"testing"
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
	if err := w.appendBatch(first, 1, 0, 1<<20, 3); err != nil {
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

	if err := w.appendBatch(second, 2, 0, 1<<20, 3); err != nil {
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
