// Package logship ships a worker agent's structured log records to the log collector.
//
// A Shipper is an io.Writer for zerolog (tee it with standard output through
// zerolog.MultiLevelWriter): Write copies each record into a bounded in-memory buffer
// and returns at once, never waiting on the network; a record that does not fit is
// dropped and counted, and the count travels with the next batches. One goroutine
// streams the buffer to the collector's /ingest WebSocket as smartroute.v1.LogBatch
// frames with sequence numbers (proto/smartroute/v1/logs.proto), keeps every batch
// until the collector acknowledges it, and after a reconnect (exponential backoff with
// jitter) resends those in order. The collector writes a sequence number at most once,
// so nothing is lost or duplicated across reconnects or collector restarts while the
// agent runs. Close flushes what it can within a bound.
package logship

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/gorilla/websocket"
	"github.com/rs/zerolog"
	"google.golang.org/protobuf/proto"

	pb "github.com/smartroute/smartroute/proto/smartroutev1"
)

// Defaults filled in by Config.WithDefaults.
const (
	DefaultBufferBytes      = 8 << 20
	DefaultMaxRecordBytes   = 256 << 10
	DefaultBatchRecords     = 1000
	DefaultBatchBytes       = 512 << 10
	DefaultMaxInFlight      = 8
	DefaultHandshakeTimeout = 10 * time.Second
	DefaultWriteTimeout     = 10 * time.Second
	DefaultReadTimeout      = 60 * time.Second
	DefaultPingInterval     = 20 * time.Second
	DefaultReconnectMin     = 100 * time.Millisecond
	DefaultReconnectMax     = 5 * time.Second
	DefaultCloseTimeout     = 5 * time.Second
	// IngestPath is where the collector accepts log streams.
	IngestPath = "/ingest"
)

// maxAckFrame bounds a frame read from the collector (welcomes and acks are tiny).
const maxAckFrame = 64 << 10

// Config configures New. Each field's comment says what its zero value means.
type Config struct {
	// URL is the collector's ingest WebSocket, ws://host:port/ingest (or wss://).
	// http:// and https:// are taken as ws:// and wss://, and an empty path means
	// /ingest. Required.
	URL string
	// WorkerID names the stream's worker, in the Worker-Id header and the hello.
	// Required.
	WorkerID string
	// Token, when set, is sent as "Authorization: Bearer <token>" on every dial (the
	// collector's ingest token). Empty means none.
	Token string
	// TLS configures wss:// dialing (a private CA). Nil means the system roots.
	TLS *tls.Config
	// Agent is free text for the hello, such as "worker-agent v1.2.3". Empty means
	// "worker-agent".
	Agent string
	// BufferBytes bounds the record bytes held: waiting for a batch plus sent and not
	// yet acknowledged. A record that does not fit is dropped and counted. Zero means
	// 8 MiB.
	BufferBytes int
	// MaxRecordBytes: a longer record is dropped and counted. Zero means 256 KiB.
	MaxRecordBytes int
	// BatchRecords caps the records of one batch. Zero means 1000.
	BatchRecords int
	// BatchBytes caps the record bytes of one batch; a single larger record goes alone.
	// Zero means 512 KiB.
	BatchBytes int
	// MaxInFlight caps the batches sent and not yet acknowledged. Zero means 8.
	MaxInFlight int
	// HandshakeTimeout bounds the dial and, separately, the wait for the welcome. Zero
	// means 10s.
	HandshakeTimeout time.Duration
	// WriteTimeout is the deadline of every frame write. Zero means 10s.
	WriteTimeout time.Duration
	// ReadTimeout is how long the connection may stay silent (no ack, ping or pong)
	// before it counts as dead. Zero means 60s.
	ReadTimeout time.Duration
	// PingInterval is how often the shipper pings the collector. Zero means 20s; it
	// must be below ReadTimeout.
	PingInterval time.Duration
	// ReconnectMin is the first wait before reconnecting; waits then double, with ±50%
	// jitter, up to ReconnectMax. Zero means 100ms.
	ReconnectMin time.Duration
	// ReconnectMax caps the reconnect wait before jitter. Zero means 5s.
	ReconnectMax time.Duration
	// CloseTimeout bounds how long Close tries to deliver what is buffered. Zero means
	// 5s.
	CloseTimeout time.Duration
	// Logger receives the shipper's own messages (connected, reconnecting). They are
	// not shipped: give it a logger that writes to standard output only. The zero
	// value discards them.
	Logger zerolog.Logger
}

// WithDefaults returns a copy of c with zero values replaced by their defaults.
func (c Config) WithDefaults() Config {
	setInt := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	setDur := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	if c.Agent == "" {
		c.Agent = "worker-agent"
	}
	setInt(&c.BufferBytes, DefaultBufferBytes)
	setInt(&c.MaxRecordBytes, DefaultMaxRecordBytes)
	setInt(&c.BatchRecords, DefaultBatchRecords)
	setInt(&c.BatchBytes, DefaultBatchBytes)
	setInt(&c.MaxInFlight, DefaultMaxInFlight)
	setDur(&c.HandshakeTimeout, DefaultHandshakeTimeout)
	setDur(&c.WriteTimeout, DefaultWriteTimeout)
	setDur(&c.ReadTimeout, DefaultReadTimeout)
	setDur(&c.PingInterval, DefaultPingInterval)
	setDur(&c.ReconnectMin, DefaultReconnectMin)
	setDur(&c.ReconnectMax, DefaultReconnectMax)
	setDur(&c.CloseTimeout, DefaultCloseTimeout)
	return c
}

func (c Config) validate() error {
	var errs []error
	if _, err := IngestURL(c.URL); err != nil {
		errs = append(errs, fmt.Errorf("URL: %w", err))
	}
	if c.WorkerID == "" {
		errs = append(errs, errors.New("WorkerID is required"))
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"BufferBytes", c.BufferBytes}, {"MaxRecordBytes", c.MaxRecordBytes}, {"BatchRecords", c.BatchRecords}, {"BatchBytes", c.BatchBytes}, {"MaxInFlight", c.MaxInFlight}} {
		if f.v < 1 {
			errs = append(errs, fmt.Errorf("%s must be at least 1, got %d", f.name, f.v))
		}
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{
		{"HandshakeTimeout", c.HandshakeTimeout}, {"WriteTimeout", c.WriteTimeout}, {"ReadTimeout", c.ReadTimeout},
		{"PingInterval", c.PingInterval}, {"ReconnectMin", c.ReconnectMin}, {"ReconnectMax", c.ReconnectMax},
		{"CloseTimeout", c.CloseTimeout},
	} {
		if f.d < 0 {
			errs = append(errs, fmt.Errorf("%s must not be negative, got %s", f.name, f.d))
		}
	}
	if c.PingInterval >= c.ReadTimeout {
		errs = append(errs, fmt.Errorf("PingInterval (%s) must be below ReadTimeout (%s)", c.PingInterval, c.ReadTimeout))
	}
	if c.ReconnectMax < c.ReconnectMin {
		errs = append(errs, fmt.Errorf("ReconnectMax (%s) must not be below ReconnectMin (%s)", c.ReconnectMax, c.ReconnectMin))
	}
	return errors.Join(errs...)
}

// IngestURL turns a collector address as an operator writes it into the WebSocket URL
// of its ingest endpoint: http→ws, https→wss, and /ingest when the path is empty.
func IngestURL(raw string) (string, error) {
	if raw == "" {
		return "", errors.New("the collector URL is required")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "", err
	}
	switch u.Scheme {
	case "ws", "wss":
	case "http":
		u.Scheme = "ws"
	case "https":
		u.Scheme = "wss"
	default:
		return "", fmt.Errorf("%q must start with ws://, wss://, http:// or https://", raw)
	}
	if u.Host == "" {
		return "", fmt.Errorf("%q has no host", raw)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = IngestPath
	}
	return u.String(), nil
}

// Stats are the shipper's counters.
type Stats struct {
	Queued   int    // records waiting for a batch
	Unacked  int    // records in batches sent (or to be resent) and not acknowledged
	Dropped  uint64 // records dropped: buffer full, record too long, written after Close, or in a batch the collector refused
	Batches  uint64 // batches formed (the last sequence number)
	Sends    uint64 // batch frames written, resends included
	Acked    uint64 // records the collector acknowledged
	Connects uint64 // connections welcomed by the collector
}

// Shipper is an io.Writer that ships what is written to it to the log collector.
type Shipper struct {
	cfg      Config
	url      string
	streamID string
	log      zerolog.Logger
	dialer   *websocket.Dialer

	// mu guards the fields below. It is held only to move records in memory, never
	// across I/O, so Write never waits on the network.
	mu      sync.Mutex
	pending [][]byte // records waiting for a batch, oldest first; Write appends, run takes
	unacked []*batch // batches formed and not acknowledged, by ascending seq
	held    int      // record bytes in pending and unacked
	closed  bool     // Close was called: Write drops
	stats   Stats
	// reported is the dropped count carried by the newest batch formed. While
	// stats.Dropped is above it, a batch is formed even with no record to carry, so
	// that drops with nothing logged after them (the last ones before Close, a lone
	// overlong record) still reach the collector.
	reported uint64

	// wake tells the run goroutine there is something to do (a record, an ack).
	// Buffered 1; anyone sends without blocking, only run receives.
	wake chan struct{}
	// closing is closed by Close: flush, then stop.
	closing chan struct{}
	// hardStop ends the flush when CloseTimeout passes; it cancels dials and closes
	// the connection, also during the upgrade (session).
	hardStop context.Context
	stopNow  context.CancelFunc
	// done is closed when the run goroutine returns.
	done      chan struct{}
	closeOnce sync.Once
	closeErr  error
}

// batch is a formed LogBatch; its frame is encoded once and resent unchanged.
type batch struct {
	seq     uint64
	records int
	bytes   int
	frame   []byte
}

// New validates cfg and starts the shipping goroutine. Close stops it.
func New(cfg Config) (*Shipper, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("log shipper config: %w", err)
	}
	u, _ := IngestURL(cfg.URL)
	var id [8]byte
	_, _ = rand.Read(id[:])
	hardStop, stopNow := context.WithCancel(context.Background())
	s := &Shipper{
		cfg:      cfg,
		url:      u,
		streamID: hex.EncodeToString(id[:]),
		log:      cfg.Logger.With().Str("component", "logship").Logger(),
		dialer:   &websocket.Dialer{HandshakeTimeout: cfg.HandshakeTimeout, Proxy: http.ProxyFromEnvironment, TLSClientConfig: cfg.TLS},
		wake:     make(chan struct{}, 1),
		closing:  make(chan struct{}),
		hardStop: hardStop,
		stopNow:  stopNow,
		done:     make(chan struct{}),
	}
	go s.run()
	return s, nil
}

// StreamID names this shipper's stream in the hello.
func (s *Shipper) StreamID() string { return s.streamID }

// Write queues one log record (zerolog writes one JSON line per call) and returns at
// once. It never fails: a record that does not fit in the buffer is dropped and
// counted, so logging never slows the agent down.
func (s *Shipper) Write(p []byte) (int, error) {
	n := len(p)
	rec := bytes.TrimRight(p, "\r\n")
	if len(rec) == 0 {
		return n, nil
	}
	rec = bytes.Clone(rec) // zerolog reuses p once Write returns
	s.mu.Lock()
	if s.closed || len(rec) > s.cfg.MaxRecordBytes || s.held+len(rec) > s.cfg.BufferBytes {
		s.stats.Dropped++
		s.mu.Unlock()
		s.signal() // the count must travel even if nothing is logged after it
		return n, nil
	}
	s.pending = append(s.pending, rec)
	s.held += len(rec)
	s.mu.Unlock()
	s.signal()
	return n, nil
}

func (s *Shipper) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Stats returns a snapshot of the counters.
func (s *Shipper) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Queued = len(s.pending)
	for _, b := range s.unacked {
		st.Unacked += b.records
	}
	return st
}

// Close stops taking records, tries for up to CloseTimeout to have everything
// buffered acknowledged, then closes the connection and stops the goroutine. It
// returns an error saying how many records were not delivered, if any. Idempotent.
func (s *Shipper) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		close(s.closing)
		t := time.AfterFunc(s.cfg.CloseTimeout, s.stopNow)
		<-s.done
		t.Stop()
		s.stopNow()
		st := s.Stats()
		if lost := st.Queued + st.Unacked; lost > 0 {
			s.closeErr = fmt.Errorf("log shipper: %d records not acknowledged by the collector within %s", lost, s.cfg.CloseTimeout)
		}
	})
	return s.closeErr
}

// ackedRecords is Stats().Acked without the rest of the snapshot.
func (s *Shipper) ackedRecords() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats.Acked
}

// flushed reports whether Close was called and nothing is left to deliver.
func (s *Shipper) flushed() bool {
	select {
	case <-s.closing:
	default:
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held == 0 && len(s.unacked) == 0 && s.reported == s.stats.Dropped
}

// acked forgets the batches up to seq and frees their bytes.
func (s *Shipper) acked(seq uint64) {
	s.mu.Lock()
	i := 0
	for ; i < len(s.unacked) && s.unacked[i].seq <= seq; i++ {
		s.held -= s.unacked[i].bytes
		s.stats.Acked += uint64(s.unacked[i].records)
	}
	if i > 0 {
		clear(s.unacked[:i])
		s.unacked = s.unacked[i:]
	}
	s.mu.Unlock()
	if i > 0 {
		s.signal()
	}
}

// nextToSend returns the first unacknowledged batch after seq lastSent, forming a new
// batch from the pending records when every unacknowledged one has been sent on this
// connection and fewer than MaxInFlight are outstanding. Nil: nothing to send now.
func (s *Shipper) nextToSend(lastSent uint64) (*batch, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range s.unacked {
		if b.seq > lastSent {
			return b, nil
		}
	}
	if len(s.pending) == 0 && s.reported == s.stats.Dropped || len(s.unacked) >= s.cfg.MaxInFlight {
		return nil, nil
	}
	n, size := 0, 0
	for n < len(s.pending) && n < s.cfg.BatchRecords {
		l := len(s.pending[n])
		if n > 0 && size+l > s.cfg.BatchBytes {
			break
		}
		n, size = n+1, size+l
	}
	s.stats.Batches++
	env := &pb.LogEnvelope{Body: &pb.LogEnvelope_Batch{Batch: &pb.LogBatch{
		Seq:     s.stats.Batches,
		Records: s.pending[:n],
		Dropped: s.stats.Dropped,
	}}}
	frame, err := proto.Marshal(env)
	if err != nil { // cannot happen with bytes fields; do not wedge the stream on it
		s.stats.Batches--
		return nil, fmt.Errorf("encode log batch: %w", err)
	}
	b := &batch{seq: s.stats.Batches, records: n, bytes: size, frame: frame}
	s.reported = s.stats.Dropped
	clear(s.pending[:n])
	s.pending = s.pending[n:]
	if len(s.pending) == 0 {
		s.pending = nil // let the backing array go
	}
	s.unacked = append(s.unacked, b)
	return b, nil
}
