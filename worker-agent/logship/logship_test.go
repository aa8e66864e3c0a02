package logship

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"

	pb "github.com/smartroute/smartroute/proto/smartroutev1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeCollector is a scripted collector: each accepted stream is handed to the
// script, numbered from 1. Until open is closed, upgrades are refused with 503.
type fakeCollector struct {
	t      *testing.T
	srv    *httptest.Server
	url    string
	open   chan struct{}
	conns  atomic.Int32
	script func(n int, c *fakeConn)
}

type fakeConn struct {
	t     *testing.T
	ws    *websocket.Conn
	hello *pb.LogHello
}

// newAckingCollector is a fake collector that welcomes every connection at seq 0 and
// acknowledges every batch, which it passes on to the returned channel.
func newAckingCollector(t *testing.T, opened bool) (*fakeCollector, chan *pb.LogBatch) {
	t.Helper()
	batches := make(chan *pb.LogBatch, 100)
	f := newFakeCollector(t, opened, func(conn int, c *fakeConn) {
		c.welcome(0)
		for {
			env, err := c.read()
			if err != nil {
				return
			}
			if b := env.GetBatch(); b != nil {
				batches <- b
				c.ack(b.GetSeq())
			}
		}
	})
	return f, batches
}

func newFakeCollector(t *testing.T, opened bool, script func(n int, c *fakeConn)) *fakeCollector {
	t.Helper()
	f := &fakeCollector{t: t, open: make(chan struct{}), script: script}
	if opened {
		close(f.open)
	}
	up := websocket.Upgrader{}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-f.open:
		default:
			http.Error(w, `{"error":"not yet"}`, http.StatusServiceUnavailable)
			return
		}
		if r.Header.Get("Worker-Id") != "w1" {
			http.Error(w, "bad worker id", http.StatusBadRequest)
			return
		}
		ws, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer ws.Close()
		c := &fakeConn{t: t, ws: ws}
		env, err := c.read()
		if err != nil {
			return
		}
		c.hello = env.GetHello()
		f.script(int(f.conns.Add(1)), c)
	}))
	f.url = "ws" + strings.TrimPrefix(f.srv.URL, "http") + "/ingest"
	t.Cleanup(f.srv.Close)
	return f
}

func (c *fakeConn) read() (*pb.LogEnvelope, error) {
	_ = c.ws.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, data, err := c.ws.ReadMessage()
	if err != nil {
		return nil, err
	}
	env := new(pb.LogEnvelope)
	return env, proto.Unmarshal(data, env)
}

func (c *fakeConn) send(env *pb.LogEnvelope) {
	b, _ := proto.Marshal(env)
	_ = c.ws.WriteMessage(websocket.BinaryMessage, b)
}

func (c *fakeConn) welcome(last uint64) {
	c.send(&pb.LogEnvelope{Body: &pb.LogEnvelope_Welcome{Welcome: &pb.LogWelcome{
		ProtocolVersion: pb.LogProtocolVersion_LOG_PROTOCOL_VERSION_CURRENT, LastSeq: last}}})
}

func (c *fakeConn) ack(seq uint64) {
	c.send(&pb.LogEnvelope{Body: &pb.LogEnvelope_Ack{Ack: &pb.LogAck{Seq: seq}}})
}

// batches reads batches until want records arrived (or the connection fails).
func (c *fakeConn) batches(want int, each func(*pb.LogBatch)) []*pb.LogBatch {
	var out []*pb.LogBatch
	got := 0
	for got < want {
		env, err := c.read()
		if err != nil {
			return out
		}
		if b := env.GetBatch(); b != nil {
			out = append(out, b)
			got += len(b.GetRecords())
			if each != nil {
				each(b)
			}
		}
	}
	return out
}

func testConfig(url string) Config {
	return Config{
		URL:          url,
		WorkerID:     "w1",
		ReconnectMin: time.Millisecond,
		ReconnectMax: 20 * time.Millisecond,
		CloseTimeout: 10 * time.Second,
	}
}

func record(i int) string { return fmt.Sprintf(`{"level":"info","i":%d,"message":"record %d"}`, i, i) }

// writeRecords writes records from..to-1. It returns an error rather than failing the
// test so that it may run on a goroutine of its own (t.Fatal may not).
func writeRecords(s *Shipper, from, to int) error {
	for i := from; i < to; i++ {
		if n, err := s.Write([]byte(record(i) + "\n")); err != nil || n != len(record(i))+1 {
			return fmt.Errorf("Write of record %d = %d, %v", i, n, err)
		}
	}
	return nil
}

// mustWrite is writeRecords on the test's goroutine.
func mustWrite(t *testing.T, s *Shipper, from, to int) {
	t.Helper()
	if err := writeRecords(s, from, to); err != nil {
		t.Fatal(err)
	}
}

func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// With no collector, Write returns at once however much is written: what does not fit
// in the buffer is dropped and counted.
func TestWriteNeverBlocksWhenCollectorIsDown(t *testing.T) {
	t.Parallel()
	cfg := testConfig("ws://" + closedAddr(t) + "/ingest")
	cfg.BufferBytes = 4096
	cfg.CloseTimeout = 50 * time.Millisecond
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	const n = 20000
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := writeRecords(s, 0, n); err != nil {
			t.Error(err)
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second): // a guard against a hang, not a synchronisation
		t.Fatal("Write blocked with the collector down")
	}
	st := s.Stats()
	if st.Dropped == 0 || st.Dropped+uint64(st.Queued) != n || st.Queued*len(record(0)) > cfg.BufferBytes {
		t.Fatalf("stats %+v: want drops, drops+queued = %d, queued within %d bytes", st, n, cfg.BufferBytes)
	}
	err = s.Close()
	if err == nil || !strings.Contains(err.Error(), "not acknowledged") {
		t.Fatalf("Close = %v, want an error counting the undelivered records", err)
	}
	if _, err := s.Write([]byte(record(0))); err != nil || s.Stats().Dropped != st.Dropped+1 {
		t.Fatalf("Write after Close: %v, dropped %d", err, s.Stats().Dropped)
	}
}

// Batches not acknowledged when the connection drops are resent, in order and
// unchanged, on the next connection.
func TestResendsUnacknowledgedBatchesAfterReconnect(t *testing.T) {
	t.Parallel()
	const n = 50
	first := make(chan []*pb.LogBatch, 1)
	second := make(chan []*pb.LogBatch, 1)
	f := newFakeCollector(t, true, func(conn int, c *fakeConn) {
		switch conn {
		case 1: // take everything, acknowledge nothing, drop the connection
			c.welcome(0)
			first <- c.batches(n, nil)
		case 2:
			c.welcome(0)
			second <- c.batches(n, func(b *pb.LogBatch) { c.ack(b.GetSeq()) })
			_, _ = c.read() // until the shipper closes
		}
	})
	cfg := testConfig(f.url)
	// The first connection waits for all n records unacknowledged. A batch holds at
	// least one record, so n in flight lets them all out however small the batches are
	// (a slow writer makes them small); with fewer the shipper could stop short.
	cfg.MaxInFlight = n
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, s, 0, n)
	b1, b2 := <-first, <-second
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if len(b1) == 0 || len(b1) != len(b2) {
		t.Fatalf("first connection got %d batches, second %d; want the same batches again", len(b1), len(b2))
	}
	i := 0
	for k := range b1 {
		if b1[k].GetSeq() != uint64(k+1) || !proto.Equal(b1[k], b2[k]) {
			t.Fatalf("batch %d: first %v, resent %v", k, b1[k], b2[k])
		}
		for _, r := range b2[k].GetRecords() {
			if string(r) != record(i) {
				t.Fatalf("record %d = %s", i, r)
			}
			i++
		}
	}
	st := s.Stats()
	if st.Acked != n || st.Connects != 2 || st.Dropped != 0 || st.Sends != 2*st.Batches {
		t.Fatalf("stats %+v", st)
	}
}

// The welcome's last_seq tells the shipper which batches the collector already has:
// those are not resent.
func TestWelcomeLastSeqSkipsWrittenBatches(t *testing.T) {
	t.Parallel()
	const n = 30
	var last atomic.Uint64
	resent := make(chan int, 1)
	f := newFakeCollector(t, true, func(conn int, c *fakeConn) {
		switch conn {
		case 1: // write everything, lose the acks with the connection
			c.welcome(0)
			bs := c.batches(n, nil)
			last.Store(bs[len(bs)-1].GetSeq())
		case 2:
			c.welcome(last.Load())
			count := 0 // anything arriving now resends a written batch
			for {
				env, err := c.read()
				if err != nil {
					break
				}
				if env.GetBatch() != nil {
					count++
				}
			}
			resent <- count
		}
	})
	cfg := testConfig(f.url)
	cfg.MaxInFlight = n // as in TestResendsUnacknowledgedBatchesAfterReconnect
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, s, 0, n)
	// Close returns once the second welcome has acknowledged everything.
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if c := <-resent; c != 0 {
		t.Fatalf("%d batches resent that the welcome said were written", c)
	}
	if st := s.Stats(); st.Acked != n || st.Connects != 2 {
		t.Fatalf("stats %+v", st)
	}
}

// Records dropped while the collector was away are counted in the batches that follow.
func TestDroppedCountIsReported(t *testing.T) {
	t.Parallel()
	f, batches := newAckingCollector(t, false)
	cfg := testConfig(f.url)
	cfg.BufferBytes = 10 * len(record(0))
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, s, 0, 100) // upgrades are refused (503): 10 fit, 90 are dropped
	st := s.Stats()
	if st.Queued != 10 || st.Dropped != 90 {
		t.Fatalf("stats before the collector opens: %+v", st)
	}
	close(f.open)
	b := <-batches
	if b.GetSeq() != 1 || b.GetDropped() != 90 || len(b.GetRecords()) != 10 {
		t.Fatalf("first batch: seq %d, dropped %d, %d records; want 1, 90, 10", b.GetSeq(), b.GetDropped(), len(b.GetRecords()))
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// Close gives up after CloseTimeout when the collector never acknowledges.
func TestCloseIsBounded(t *testing.T) {
	t.Parallel()
	received := make(chan struct{}, 1)
	f := newFakeCollector(t, true, func(conn int, c *fakeConn) {
		c.welcome(0)
		for {
			if _, err := c.read(); err != nil {
				return
			}
			select {
			case received <- struct{}{}:
			default:
			}
		}
	})
	cfg := testConfig(f.url)
	cfg.CloseTimeout = 100 * time.Millisecond
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, s, 0, 3)
	<-received
	start := time.Now()
	err = s.Close()
	if err == nil || !strings.Contains(err.Error(), "3 records not acknowledged") {
		t.Fatalf("Close = %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Close took %s with a 100ms bound", d)
	}
}

// Close is bounded by CloseTimeout also while the upgrade is unanswered: a collector
// (or a mesh sidecar before it) that accepts TCP and says nothing. gorilla/websocket
// heeds the dial context's deadline there, not its cancellation, so the upgrade would
// run on for HandshakeTimeout.
func TestCloseCutsAnUnansweredUpgrade(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	requested := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		// Read the upgrade request, then say nothing.
		if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
			t.Errorf("upgrade request: %v", err)
		}
		requested <- c
	}()
	cfg := testConfig("ws://" + ln.Addr().String() + "/ingest")
	cfg.CloseTimeout, cfg.HandshakeTimeout = 50*time.Millisecond, time.Minute
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, s, 0, 1)
	c := <-requested // the shipper is waiting for the upgrade's response
	defer c.Close()
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case err = <-closed:
	case <-time.After(20 * time.Second): // far below HandshakeTimeout, far above CloseTimeout
		c.Close() // fails the upgrade, so that Close returns
		<-closed
		t.Fatalf("Close still waiting 20s into a %s CloseTimeout: the unanswered upgrade was not cut", cfg.CloseTimeout)
	}
	if err == nil || !strings.Contains(err.Error(), "1 records not acknowledged") {
		t.Fatalf("Close = %v", err)
	}
}

func TestIngestURL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"ws://127.0.0.1:8090/ingest":  "ws://127.0.0.1:8090/ingest",
		"http://127.0.0.1:8090":       "ws://127.0.0.1:8090/ingest",
		"https://logs.example/":       "wss://logs.example/ingest",
		"wss://logs.example/x/ingest": "wss://logs.example/x/ingest",
		"ftp://x":                     "",
		"ws://":                       "",
		"":                            "",
	} {
		got, err := IngestURL(in)
		if got != want || (want == "") != (err != nil) {
			t.Errorf("IngestURL(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	t.Parallel()
	_, err := New(Config{URL: "tcp://x", BufferBytes: -1, PingInterval: time.Minute, ReadTimeout: time.Second})
	for _, want := range []string{"URL", "WorkerID", "BufferBytes", "PingInterval"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not name %s", err, want)
		}
	}
}

// The cost of a log record to the agent, with a full buffer (the worst case).
func BenchmarkWriteFullBuffer(b *testing.B) {
	cfg := Config{URL: "ws://127.0.0.1:1/ingest", WorkerID: "w1", BufferBytes: 1, CloseTimeout: time.Millisecond}
	s, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	rec := []byte(record(1) + "\n")
	b.ReportAllocs()
	for b.Loop() {
		_, _ = s.Write(rec)
	}
}

// The cost of a log record to the agent while it is queued.
func BenchmarkWriteQueued(b *testing.B) {
	cfg := Config{URL: "ws://127.0.0.1:1/ingest", WorkerID: "w1", BufferBytes: 1 << 30, CloseTimeout: time.Millisecond}
	s, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	rec := []byte(record(1) + "\n")
	b.ReportAllocs()
	for b.Loop() {
		_, _ = s.Write(rec)
	}
}

// signalWriter closes ready when a log line holds want.
type signalWriter struct {
	want  string
	ready chan struct{}
	once  sync.Once
}

func (w *signalWriter) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte(w.want)) {
		w.once.Do(func() { close(w.ready) })
	}
	return len(p), nil
}

// Close during a backoff wait tries to deliver at once: a collector back up after an
// outage gets the buffered records, rather than the shipper sleeping out its wait
// past CloseTimeout and dropping them.
func TestCloseFlushesWithoutWaitingOutTheBackoff(t *testing.T) {
	t.Parallel()
	const n = 10
	got := make(chan []*pb.LogBatch, 1)
	f := newFakeCollector(t, false, func(conn int, c *fakeConn) {
		c.welcome(0)
		got <- c.batches(n, func(b *pb.LogBatch) { c.ack(b.GetSeq()) })
		_, _ = c.read() // until the shipper closes
	})
	cfg := testConfig(f.url)
	cfg.ReconnectMin, cfg.ReconnectMax, cfg.CloseTimeout = time.Hour, time.Hour, 3*time.Second
	down := &signalWriter{want: "reconnecting after backoff", ready: make(chan struct{})}
	cfg.Logger = zerolog.New(down)
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, s, 0, n)
	<-down.ready // refused once; now waiting about an hour
	close(f.open)
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if st := s.Stats(); st.Acked != n {
		t.Fatalf("stats %+v, want %d records acknowledged", st, n)
	}
	if b := <-got; len(b) == 0 {
		t.Fatal("the collector got no batch")
	}
}

// Drops with nothing logged after them still reach the collector: a lone overlong
// record is reported in a batch of its own, and Close waits for its acknowledgement.
func TestDropsWithNothingAfterThemAreReported(t *testing.T) {
	t.Parallel()
	f, batches := newAckingCollector(t, true)
	cfg := testConfig(f.url)
	cfg.MaxRecordBytes = len(record(0))
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, s, 0, 1)
	first := <-batches // the record's batch is formed before the drop
	records, dropped := len(first.GetRecords()), first.GetDropped()
	if _, err := s.Write([]byte(record(0) + `,"pad":"` + strings.Repeat("x", 64) + "\n")); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	close(batches)
	for b := range batches {
		records += len(b.GetRecords())
		dropped = max(dropped, b.GetDropped())
	}
	if records != 1 || dropped != 1 {
		t.Fatalf("collector got %d records and a dropped count of %d, want 1 and 1", records, dropped)
	}
}

// A batch the collector refuses (BAD_FRAME: too many records, or lines that would
// outgrow the frame; 1009: over its frame limit) would be refused again however often
// it is resent, holding every later record back: it is dropped and counted instead,
// and the batches after it are delivered.
func TestRefusedBatchIsDroppedNotResent(t *testing.T) {
	t.Parallel()
	for _, code := range []int{int(pb.CloseCode_CLOSE_CODE_BAD_FRAME), websocket.CloseMessageTooBig} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			t.Parallel()
			const n = 20
			refused := make(chan *pb.LogBatch, 1)
			delivered := make(chan []*pb.LogBatch, 1)
			f := newFakeCollector(t, true, func(conn int, c *fakeConn) {
				switch conn {
				case 1:
					c.welcome(0)
					b := c.batches(1, nil)
					msg := websocket.FormatCloseMessage(code, "batch refused")
					_ = c.ws.WriteControl(websocket.CloseMessage, msg, time.Now().Add(time.Second))
					refused <- b[0]
				case 2: // acknowledge everything until the shipper closes
					c.welcome(0)
					var bs []*pb.LogBatch
					for {
						env, err := c.read()
						if err != nil {
							break
						}
						if b := env.GetBatch(); b != nil {
							bs = append(bs, b)
							c.ack(b.GetSeq())
						}
					}
					delivered <- bs
				}
			})
			cfg := testConfig(f.url)
			cfg.BatchRecords = 5 // records are left for the batches after the refused one
			s, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			mustWrite(t, s, 0, n)
			dropped := len((<-refused).GetRecords())
			if err := s.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			bs := <-delivered
			st := s.Stats()
			if len(bs) == 0 || bs[0].GetSeq() != 2 || st.Acked != uint64(n-dropped) || st.Dropped != uint64(dropped) {
				t.Fatalf("after the refusal: batches %v, stats %+v; want seq 2 first and the refused batch's records dropped", bs, st)
			}
			for _, b := range bs {
				if b.GetSeq() == 1 {
					t.Fatal("the refused batch was resent")
				}
			}
			if got := bs[len(bs)-1].GetDropped(); got != uint64(dropped) {
				t.Fatalf("last batch reports %d dropped, want %d", got, dropped)
			}
		})
	}
}
