package logcollector

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/gorilla/websocket"
	"github.com/rs/zerolog"
	"google.golang.org/protobuf/proto"

	pb "github.com/smartroute/smartroute/proto/smartroutev1"
	"github.com/smartroute/smartroute/worker-agent/logship"
)

func TestHealth(t *testing.T) {
	t.Parallel()
	r := startCollector(t, Config{})
	code, body := r.get("/health")
	if code != 200 || strings.TrimSpace(string(body)) != `{"message":"OK"}` {
		t.Fatalf("GET /health = %d %s", code, body)
	}
}

// A batch is acknowledged once its records are in the worker's file and its seq in
// the worker's state.
func TestIngestWritesThenAcknowledges(t *testing.T) {
	t.Parallel()
	r := startCollector(t, Config{})
	a, last := connect(t, r.ingestURL(), "w1", "s1")
	if last != 0 {
		t.Fatalf("welcome last_seq = %d for a new worker", last)
	}
	recs := []string{`{"level":"info","message":"a"}`, `{"level":"warn","message":"b"}`, `not json`}
	if ack := a.batch(1, 0, recs...); ack != 1 {
		t.Fatalf("ack = %d", ack)
	}
	got := lines(t, r.dir, "w1")
	want := []string{recs[0], recs[1], `{"worker_id":"w1","event":"invalid_log_record","raw":"not json"}`}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("file holds\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if st := readState(t, r.dir, "w1"); st.LastSeq != 1 || st.StreamID != "s1" || st.File != 1 {
		t.Fatalf("state %+v", st)
	}
}

// A batch sent twice is written once; a reconnect of the same stream learns where it
// stands; a new stream starts again at 1.
func TestDuplicateBatchIsWrittenOnce(t *testing.T) {
	t.Parallel()
	r := startCollector(t, Config{})
	a, _ := connect(t, r.ingestURL(), "w1", "s1")
	a.batch(1, 0, `{"n":1}`)
	if ack := a.batch(1, 0, `{"n":1}`); ack != 1 {
		t.Fatalf("duplicate acknowledged as %d", ack)
	}
	a.batch(2, 0, `{"n":2}`)
	a.ws.Close()

	b, last := connect(t, r.ingestURL(), "w1", "s1")
	if last != 2 {
		t.Fatalf("reconnect: welcome last_seq = %d, want 2", last)
	}
	b.batch(2, 0, `{"n":2}`) // resent anyway
	b.batch(3, 5, `{"n":3}`) // the agent dropped 5 records before this batch
	b.ws.Close()

	c, last := connect(t, r.ingestURL(), "w1", "s2")
	if last != 0 {
		t.Fatalf("new stream: welcome last_seq = %d, want 0", last)
	}
	c.batch(1, 0, `{"n":4}`)

	got := lines(t, r.dir, "w1")
	if len(got) != 5 || got[0] != `{"n":1}` || got[1] != `{"n":2}` || got[3] != `{"n":3}` || got[4] != `{"n":4}` {
		t.Fatalf("file holds %q", got)
	}
	var note collectorNote
	if err := json.Unmarshal([]byte(got[2]), &note); err != nil || note.Event != "log_records_dropped" || note.Dropped != 5 {
		t.Fatalf("drop note %q (%v)", got[2], err)
	}
}

// Opening a worker cuts off what was written after its last acknowledged batch, so
// the resend of that batch is not duplicated.
func TestReopenCutsUnacknowledgedTail(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	r := startCollector(t, Config{Dir: dir})
	a, _ := connect(t, r.ingestURL(), "w1", "s1")
	a.batch(1, 0, `{"n":1}`)
	a.ws.Close()
	r.stop()
	// A crash after writing batch 2 and before recording it, and after starting a new file.
	f, err := os.OpenFile(filepath.Join(dir, "w1", "00000001.jsonl"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprint(f, "{\"n\":2}\n{\"n\":")
	f.Close()
	if err := os.WriteFile(filepath.Join(dir, "w1", "00000002.jsonl"), []byte("{\"n\":3}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r2 := startCollector(t, Config{Dir: dir})
	b, last := connect(t, r2.ingestURL(), "w1", "s1")
	if last != 1 {
		t.Fatalf("welcome last_seq = %d", last)
	}
	b.batch(2, 0, `{"n":2}`)
	if got := lines(t, dir, "w1"); strings.Join(got, " ") != `{"n":1} {"n":2}` {
		t.Fatalf("file holds %q", got)
	}
}

func TestIngestRefusals(t *testing.T) {
	t.Parallel()
	r := startCollector(t, Config{})
	for _, tc := range []struct {
		worker string
		want   string
	}{
		{"", "Worker-Id header is required"},
		{"w 1", "printable ASCII"},
		{strings.Repeat("w", 257), "Worker-Id is 257 bytes long, the limit is 256"},
	} {
		_, resp, err := dialIngest(t, r.ingestURL(), tc.worker)
		if err == nil || resp == nil || resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("Worker-Id %q: err %v resp %v, want 400", tc.worker, err, resp)
		}
		var body errorBody
		_ = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if !strings.Contains(body.Error, tc.want) {
			t.Fatalf("Worker-Id %q: error %q, want it to say %q", tc.worker, body.Error, tc.want)
		}
	}
	for name, tc := range map[string]struct {
		hello *pb.LogEnvelope
		code  pb.CloseCode
	}{
		"old version": {&pb.LogEnvelope{Body: &pb.LogEnvelope_Hello{Hello: &pb.LogHello{WorkerId: "w1", StreamId: "s"}}}, pb.CloseCode_CLOSE_CODE_PROTOCOL_VERSION},
		"other id": {&pb.LogEnvelope{Body: &pb.LogEnvelope_Hello{Hello: &pb.LogHello{
			ProtocolVersion: pb.LogProtocolVersion_LOG_PROTOCOL_VERSION_CURRENT, WorkerId: "w2", StreamId: "s"}}}, pb.CloseCode_CLOSE_CODE_BAD_FRAME},
		"batch first": {&pb.LogEnvelope{Body: &pb.LogEnvelope_Batch{Batch: &pb.LogBatch{Seq: 1}}}, pb.CloseCode_CLOSE_CODE_BAD_FRAME},
		// Rewritten into state.json with every batch: a megabyte would cost a megabyte
		// fsynced per batch.
		"long stream id": {&pb.LogEnvelope{Body: &pb.LogEnvelope_Hello{Hello: &pb.LogHello{
			ProtocolVersion: pb.LogProtocolVersion_LOG_PROTOCOL_VERSION_CURRENT, WorkerId: "w1", StreamId: strings.Repeat("s", maxStreamIDBytes+1)}}}, pb.CloseCode_CLOSE_CODE_BAD_FRAME},
		"long agent": {&pb.LogEnvelope{Body: &pb.LogEnvelope_Hello{Hello: &pb.LogHello{
			ProtocolVersion: pb.LogProtocolVersion_LOG_PROTOCOL_VERSION_CURRENT, WorkerId: "w1", StreamId: "s", Agent: strings.Repeat("a", maxAgentBytes+1)}}}, pb.CloseCode_CLOSE_CODE_BAD_FRAME},
		// A hello is read before the stream takes a batch slot, so it is not read whole
		// up to the batch limit: a herd of reconnecting streams would hold that each.
	} {
		a, _, err := dialIngest(t, r.ingestURL(), "w1")
		if err != nil {
			t.Fatal(err)
		}
		a.send(tc.hello)
		if code := a.closeCode(); code != int(tc.code) {
			t.Errorf("%s: close code %d, want %d (%s)", name, code, tc.code, tc.code)
		}
	}
}

// A hello is read before the stream takes a batch slot, so it is not read whole up to
// the batch limit: a herd of reconnecting streams would each hold that much.
func TestHugeHelloIsNotReadWhole(t *testing.T) {
	t.Parallel()
	r := startCollector(t, Config{})
	a, _, err := dialIngest(t, r.ingestURL(), "w1")
	if err != nil {
		t.Fatal(err)
	}
	b, err := proto.Marshal(&pb.LogEnvelope{Body: &pb.LogEnvelope_Hello{Hello: &pb.LogHello{
		ProtocolVersion: pb.LogProtocolVersion_LOG_PROTOCOL_VERSION_CURRENT, WorkerId: "w1", StreamId: "s", Agent: strings.Repeat("a", 64<<10)}}})
	if err != nil {
		t.Fatal(err)
	}
	// The collector may close while the frame is still being written; then the write,
	// or the read after it, sees the connection reset instead of the close frame. Read
	// whole, the hello would have been answered BAD_FRAME for its agent field.
	_ = a.ws.WriteMessage(websocket.BinaryMessage, b)
	_ = a.ws.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		_, _, err := a.ws.ReadMessage()
		var ce *websocket.CloseError
		if errors.As(err, &ce) {
			if ce.Code != websocket.CloseMessageTooBig {
				t.Fatalf("close code %d, want %d: the hello was read whole", ce.Code, websocket.CloseMessageTooBig)
			}
			return
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatal("no close within 10 s")
			}
			return // reset: closed before the frame was read whole
		}
	}
}

// A second stream for a worker replaces the first, which is closed with REPLACED.
func TestNewerStreamReplacesOlder(t *testing.T) {
	t.Parallel()
	r := startCollector(t, Config{})
	a, _ := connect(t, r.ingestURL(), "w1", "s1")
	b, _ := connect(t, r.ingestURL(), "w1", "s2")
	if code := a.closeCode(); code != int(pb.CloseCode_CLOSE_CODE_REPLACED) {
		t.Fatalf("older stream closed with %d", code)
	}
	b.batch(1, 0, `{"n":1}`)
}

// Shutdown closes live streams with SHUTDOWN.
func TestShutdownClosesStreams(t *testing.T) {
	t.Parallel()
	r := startCollector(t, Config{})
	a, _ := connect(t, r.ingestURL(), "w1", "s1")
	go r.stop()
	if code := a.closeCode(); code != int(pb.CloseCode_CLOSE_CODE_SHUTDOWN) {
		t.Fatalf("close code %d, want SHUTDOWN", code)
	}
}

// Files rotate by size; the oldest beyond MaxFiles are deleted; the files left hold the
// newest records in order.
func TestRotation(t *testing.T) {
	t.Parallel()
	r := startCollector(t, Config{MaxFileBytes: 100, MaxFiles: 3})
	a, _ := connect(t, r.ingestURL(), "w1", "s1")
	rec := func(i int) string { return fmt.Sprintf(`{"i":%d,"pad":"%s"}`, i, strings.Repeat("x", 20)) } // 35-36 bytes
	for i := 1; i <= 20; i++ {
		a.batch(uint64(i), 0, rec(i))
	}
	files, _ := filepath.Glob(filepath.Join(r.dir, "w1", "*.jsonl"))
	if len(files) != 3 {
		t.Fatalf("%d files: %v", len(files), files)
	}
	for _, f := range files {
		if fi, _ := os.Stat(f); fi.Size() > 100 {
			t.Fatalf("%s has %d bytes, over the 100 allowed", f, fi.Size())
		}
	}
	if filepath.Base(files[2]) != fmt.Sprintf("%08d.jsonl", readState(t, r.dir, "w1").File) {
		t.Fatalf("current file %s, state %+v", files[2], readState(t, r.dir, "w1"))
	}
	got := lines(t, r.dir, "w1")
	for k, l := range got {
		if want := rec(20 - len(got) + 1 + k); l != want {
			t.Fatalf("line %d = %s, want %s (lines %q)", k, l, want, got)
		}
	}
	// A batch larger than a file gets a file of its own.
	big := `{"big":"` + strings.Repeat("y", 150) + `"}`
	a.batch(21, 0, big)
	if got := lines(t, r.dir, "w1"); got[len(got)-1] != big {
		t.Fatalf("big record not last: %q", got)
	}
}

// The collector stops mid-stream, losing the ack of a batch it wrote; another one
// starts on the same directory and port; the agent's shipper resends, and every
// record is in the files exactly once, in order.
func TestRestartMidStreamKeepsEveryRecordOnce(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	crashed := make(chan struct{})
	var once sync.Once
	// Both sides log to the test: shown only if it fails (it failed once in CI, 20 s
	// with nothing acknowledged after the restart, and never again in 100 runs).
	logger := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)
	first := startCollector(t, Config{Dir: dir, Logger: logger.With().Str("collector", "first").Logger(), hooks: &testHooks{afterWrite: func(worker string, seq uint64) error {
		if seq < 3 {
			return nil
		}
		once.Do(func() { close(crashed) })
		return errors.New("simulated crash between the write and the ack")
	}}})
	s, err := logship.New(logship.Config{
		URL: first.ingestURL(), WorkerID: "w1", BatchRecords: 7, MaxInFlight: 2,
		ReconnectMin: time.Millisecond, ReconnectMax: 20 * time.Millisecond, CloseTimeout: 20 * time.Second,
		Logger: logger.With().Str("shipper", "w1").Logger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	const n = 3000
	write := func(from, to int) {
		for i := from; i < to; i++ {
			fmt.Fprintf(s, `{"level":"info","i":%d}`+"\n", i)
		}
	}
	write(0, n/3)
	<-crashed
	first.stop()
	write(n/3, 2*n/3) // the collector is away
	startCollector(t, Config{Dir: dir, Addr: first.addr, Logger: logger.With().Str("collector", "second").Logger()})
	write(2*n/3, n)
	if err := s.Close(); err != nil {
		t.Fatalf("shipper Close: %v", err)
	}
	if st := s.Stats(); st.Dropped != 0 || st.Acked != n || st.Connects < 2 {
		t.Fatalf("shipper stats %+v", st)
	}
	got := lines(t, dir, "w1")
	if len(got) != n {
		t.Fatalf("%d records in the files, want %d", len(got), n)
	}
	for i, l := range got {
		if want := fmt.Sprintf(`{"level":"info","i":%d}`, i); l != want {
			t.Fatalf("line %d = %s, want %s", i, l, want)
		}
	}
}

func TestMissingBatchesAreNoted(t *testing.T) {
	t.Parallel()
	r := startCollector(t, Config{})
	a, _ := connect(t, r.ingestURL(), "w1", "s1")
	a.batch(1, 0, `{"n":1}`)
	a.batch(4, 0, `{"n":4}`)
	got := lines(t, r.dir, "w1")
	var note collectorNote
	if len(got) != 3 || json.Unmarshal([]byte(got[1]), &note) != nil || note.Event != "log_batches_missing" || note.MissingFrom != 2 || note.MissingTo != 3 {
		t.Fatalf("lines %q", got)
	}
}

// A record whose strings hold invalid UTF-8 is still one JSON object per line, valid
// UTF-8, with its fields intact: the file and GET /logs stay readable by strict JSON
// readers, and the record still counts under its event.
func TestInvalidUTF8RecordIsStoredAsValidJSON(t *testing.T) {
	t.Parallel()
	r := startCollector(t, Config{})
	a, _ := connect(t, r.ingestURL(), "w1", "s1")
	rec := "{\"level\":\"warn\",\"event\":\"label_miss\",\"message\":\"bad \xff\xfe bytes\"}"
	if ack := a.batch(1, 0, rec); ack != 1 {
		t.Fatalf("ack = %d", ack)
	}
	got := lines(t, r.dir, "w1")
	if len(got) != 1 || !utf8.ValidString(got[0]) || !json.Valid([]byte(got[0])) {
		t.Fatalf("file holds %q, want one valid UTF-8 JSON line", got)
	}
	var f struct{ Event, Message string }
	if err := json.Unmarshal([]byte(got[0]), &f); err != nil || f.Event != "label_miss" || f.Message != "bad \uFFFD bytes" {
		t.Fatalf("stored record %q: event %q message %q, err %v", got[0], f.Event, f.Message, err)
	}
	code, body := r.get("/logs?worker=w1&event=label_miss")
	if code != 200 || !utf8.Valid(body) {
		t.Fatalf("GET /logs = %d, %q: want 200 and valid UTF-8", code, body)
	}
}

// An agent replaced by a newer process under the same worker id (the old one still
// flushing) reconnects and resends a batch whose ack it lost: the collector remembers
// where that stream stood and does not write the batch twice.
func TestReplacedStreamReconnectingIsNotWrittenTwice(t *testing.T) {
	t.Parallel()
	r := startCollector(t, Config{})
	old, _ := connect(t, r.ingestURL(), "w1", "old")
	old.batch(1, 0, `{"n":1}`)
	old.batch(2, 0, `{"n":2}`) // say its ack was lost: the agent still holds batch 2

	successor, _ := connect(t, r.ingestURL(), "w1", "new")
	if code := old.closeCode(); code != int(pb.CloseCode_CLOSE_CODE_REPLACED) {
		t.Fatalf("old stream closed with %d, want REPLACED", code)
	}
	successor.batch(1, 0, `{"n":3}`)

	again, last := connect(t, r.ingestURL(), "w1", "old")
	if last != 2 {
		t.Fatalf("the replaced stream reconnecting: welcome last_seq = %d, want 2", last)
	}
	again.batch(2, 0, `{"n":2}`)
	again.batch(3, 0, `{"n":4}`)
	again.ws.Close()

	// Restarted, the collector still knows both streams.
	r.stop()
	r2 := startCollector(t, Config{Dir: r.dir})
	if _, last := connect(t, r2.ingestURL(), "w1", "new"); last != 1 {
		t.Fatalf("after a restart the successor's welcome last_seq = %d, want 1", last)
	}
	got := lines(t, r.dir, "w1")
	if strings.Join(got, " ") != `{"n":1} {"n":2} {"n":3} {"n":4}` {
		t.Fatalf("file holds %q, want each record once", got)
	}
}

// A request to /ingest that is no WebSocket handshake is refused in JSON, as the
// collector's other errors are, not with the upgrader's plain-text "Bad Request".
func TestIngestRefusesANonWebSocketRequestInJSON(t *testing.T) {
	t.Parallel()
	r := startCollector(t, Config{})
	req, err := http.NewRequest("GET", "http://"+r.addr+"/ingest", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Worker-Id", "w1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body errorBody
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode != http.StatusBadRequest ||
		resp.Header.Get("Content-Type") != "application/json" || !strings.Contains(body.Error, "websocket") {
		t.Fatalf("plain GET /ingest: %d %v %q (%v); want 400 JSON naming the WebSocket handshake",
			resp.StatusCode, resp.Header, body.Error, err)
	}
}
