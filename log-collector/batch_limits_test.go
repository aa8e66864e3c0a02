package logcollector

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gorilla/websocket"

	pb "github.com/smartroute/smartroute/proto/smartroutev1"
)

// batchFrame encodes a batch of n copies of rec.
func batchFrame(t testing.TB, seq uint64, n int, rec []byte) []byte {
	t.Helper()
	b := &pb.LogBatch{Seq: seq, Records: make([][]byte, n)}
	for i := range b.Records {
		b.Records[i] = rec
	}
	frame, err := protoMarshal(&pb.LogEnvelope{Body: &pb.LogEnvelope_Batch{Batch: b}})
	if err != nil {
		t.Fatal(err)
	}
	return frame
}

// A batch must not cost the collector far more than its frame. Empty records cost two
// bytes of frame each; before the bound, a 256 KiB frame of 131,040 of them was
// acknowledged and written as 15.6 MB of invalid_log_record lines, all built in
// memory first (133 MiB allocated). Such batches are refused with BAD_FRAME, before
// anything is written: too many records, or lines that would outgrow the frame.
func TestBatchThatWouldOutgrowItsFrameIsRefused(t *testing.T) {
	t.Parallel()
	const frameLimit = 256 << 10
	worker := strings.Repeat("w", 64)
	for _, c := range []struct {
		name   string
		frame  []byte
		reason string
	}{
		{"too many records", batchFrame(t, 1, (frameLimit-64)/2, []byte{}), "records exceeds the limit of 10000"},
		// Within the count, but each wrapped with the worker id: 1.1 MB of lines from a
		// 20 KB frame.
		{"lines outgrow the frame", batchFrame(t, 1, maxBatchRecords, []byte{}), "too many non-JSON records"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if len(c.frame) > frameLimit {
				t.Fatalf("frame of %d bytes is over the limit", len(c.frame))
			}
			r := startCollector(t, Config{MaxFrameBytes: frameLimit})
			a, _ := connect(t, r.ingestURL(), worker, "s1")
			if err := a.ws.WriteMessage(websocket.BinaryMessage, c.frame); err != nil {
				t.Fatal(err)
			}
			ce := a.closeFrame()
			if ce.Code != int(pb.CloseCode_CLOSE_CODE_BAD_FRAME) || !strings.Contains(ce.Text, c.reason) {
				t.Fatalf("closed with %d %q, want BAD_FRAME saying %q", ce.Code, ce.Text, c.reason)
			}
			files, _ := filepath.Glob(filepath.Join(r.dir, dirName(worker), "*"+dataSuffix))
			for _, f := range files {
				if fi, err := os.Stat(f); err != nil || fi.Size() != 0 {
					t.Fatalf("%s: %v, size %d: a refused batch was written", f, err, fi.Size())
				}
			}
			// The stream starts again where it stood: nothing of the batch was taken.
			if _, last := connect(t, r.ingestURL(), worker, "s1"); last != 0 {
				t.Fatalf("welcome last_seq %d after a refused batch, want 0", last)
			}
		})
	}
}

// What the agent sends is within the bounds: a full batch of the shipper's largest
// records, and one of the most records it sends, some of them not JSON.
func TestBatchesAnAgentSendsAreWithinTheBounds(t *testing.T) {
	t.Parallel()
	r := startCollector(t, Config{})
	a, _ := connect(t, r.ingestURL(), "w1", "s1")
	big := `{"level":"info","pad":"` + strings.Repeat("x", 256<<10-30) + `"}`
	if ack := a.batch(1, 0, big, big); ack != 1 {
		t.Fatalf("ack %d", ack)
	}
	recs := make([]string, 1000)
	for i := range recs {
		recs[i] = `{"level":"info","n":1}`
		if i%2 == 0 {
			recs[i] = "plain text"
		}
	}
	if ack := a.batch(2, 0, recs...); ack != 2 {
		t.Fatalf("ack %d", ack)
	}
	if got := lines(t, r.dir, "w1"); len(got) != 1002 || got[2] != `{"worker_id":"w1","event":"invalid_log_record","raw":"plain text"}` {
		t.Fatalf("%d lines, the third %q", len(got), got[2])
	}
}

// What one batch costs from its frame on (decoded, planned, written), refused or not:
// go test -run '^$' -bench BatchCost -benchtime 3x ./log-collector
func BenchmarkBatchCost(b *testing.B) {
	rec := []byte(`{"level":"info","time":"2026-03-01T12:00:00.123456Z","worker_id":"worker-1","event":"task_completed","task_id":"0123456789abcdef","label":"resnet50","ms":12.5}`)
	for _, c := range []struct {
		name  string
		frame []byte
	}{
		{"empty-records-256KiB", batchFrame(b, 1, (256<<10-64)/2, []byte{})},
		{"empty-records-16MiB", batchFrame(b, 1, (16<<20-64)/2, []byte{})},
		{"empty-records-10000", batchFrame(b, 1, maxBatchRecords, []byte{})},
		{"json-512KiB", batchFrame(b, 1, (512<<10)/len(rec), rec)},
	} {
		b.Run(c.name, func(b *testing.B) {
			col, err := New(Config{Dir: b.TempDir(), MaxFileBytes: 1 << 40, MaxFrameBytes: 32 << 20})
			if err != nil {
				b.Fatal(err)
			}
			defer col.Close()
			worker := strings.Repeat("w", 64)
			w, err := col.store.worker(worker)
			if err != nil {
				b.Fatal(err)
			}
			ic := &ingestConn{worker: worker, done: make(chan struct{})}
			w.owner = ic
			b.SetBytes(int64(len(c.frame)))
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				env, err := col.decodeMessage(websocket.BinaryMessage, c.frame)
				if err != nil {
					continue // refused before decoding
				}
				env.GetBatch().Seq = uint64(i + 1)
				_, _ = col.writeBatch(w, ic, env.GetBatch(), len(c.frame))
			}
		})
	}
}
