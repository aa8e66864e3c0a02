package logship

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/gorilla/websocket"
	"google.golang.org/protobuf/proto"

	"github.com/smartroute/smartroute/proto/credential"
	pb "github.com/smartroute/smartroute/proto/smartroutev1"
	"github.com/smartroute/smartroute/worker-agent/internal/wsdial"
)

// errFlushed ends a session after Close once everything was acknowledged.
var errFlushed = errors.New("flushed")

// run is the shipping goroutine: it keeps a session to the collector up until Close
// has flushed everything or CloseTimeout passed.
func (s *Shipper) run() {
	defer close(s.done)
	bo := &backoff.ExponentialBackOff{
		InitialInterval:     s.cfg.ReconnectMin,
		RandomizationFactor: 0.5,
		Multiplier:          2,
		MaxInterval:         s.cfg.ReconnectMax,
	}
	bo.Reset()
	// Close cuts one backoff wait short, so that the flush is tried at once rather
	// than after a wait that may outlast CloseTimeout; later waits run their course.
	closing := s.closing
	for {
		if s.flushed() || s.hardStop.Err() != nil {
			return
		}
		acked, start := s.ackedRecords(), time.Now()
		welcomed, err := s.session()
		if errors.Is(err, errFlushed) || s.hardStop.Err() != nil {
			return
		}
		// The collector was there and working: the next try is prompt. A welcome alone
		// does not show that (a collector that cannot write welcomes, then closes the
		// stream on the first batch), so the session must have had batches
		// acknowledged, or have lasted as long as the longest wait.
		if welcomed && (s.ackedRecords() > acked || time.Since(start) >= s.cfg.ReconnectMax) {
			bo.Reset()
		}
		wait := bo.NextBackOff()
		s.log.Info().Err(err).Str("collector_url", s.url).Float64("retry_in_ms", float64(wait)/1e6).
			Msg("log stream down, reconnecting after backoff")
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-closing:
			closing = nil
		case <-s.hardStop.Done():
		}
		t.Stop()
	}
}

// session dials the collector, says hello, resends the unacknowledged batches and
// streams new ones until the connection fails or Close has flushed everything
// (errFlushed). welcomed says whether the collector accepted the hello.
func (s *Shipper) session() (welcomed bool, err error) {
	dctx, cancel := context.WithTimeout(s.hardStop, s.cfg.HandshakeTimeout)
	header := http.Header{"Worker-Id": []string{s.cfg.WorkerID}}
	if s.cfg.Token != "" {
		header.Set("Authorization", credential.Header(s.cfg.Token))
	}
	// Past CloseTimeout any read or write in progress ends at once: the connection is
	// closed, from the dial on (the upgrade would otherwise wait out HandshakeTimeout).
	d, unwatch := wsdial.Watched(s.dialer, s.hardStop)
	defer unwatch()
	conn, resp, err := d.DialContext(dctx, s.url, header)
	cancel()
	if err != nil {
		return false, dialError(resp, err)
	}
	defer conn.Close()
	conn.SetReadLimit(maxAckFrame)

	hello := &pb.LogEnvelope{Body: &pb.LogEnvelope_Hello{Hello: &pb.LogHello{
		ProtocolVersion: pb.LogProtocolVersion_LOG_PROTOCOL_VERSION_CURRENT,
		WorkerId:        s.cfg.WorkerID,
		StreamId:        s.streamID,
		Agent:           s.cfg.Agent,
	}}}
	b, _ := proto.Marshal(hello)
	if err := s.writeFrame(conn, b); err != nil {
		return false, fmt.Errorf("send hello: %w", err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(s.cfg.HandshakeTimeout))
	env, err := readEnvelope(conn)
	if err != nil {
		return false, fmt.Errorf("await welcome: %w", err)
	}
	w := env.GetWelcome()
	if w == nil {
		return false, fmt.Errorf("await welcome: got %T", env.GetBody())
	}
	if v := w.GetProtocolVersion(); v != pb.LogProtocolVersion_LOG_PROTOCOL_VERSION_CURRENT {
		return false, fmt.Errorf("collector speaks log protocol version %d, this agent %d", v, pb.LogProtocolVersion_LOG_PROTOCOL_VERSION_CURRENT)
	}
	s.acked(w.GetLastSeq())
	s.mu.Lock()
	s.stats.Connects++
	s.mu.Unlock()
	s.log.Info().Str("collector_url", s.url).Uint64("last_seq", w.GetLastSeq()).Msg("log stream connected")

	extend := func() { _ = conn.SetReadDeadline(time.Now().Add(s.cfg.ReadTimeout)) }
	extend()
	conn.SetPingHandler(func(data string) error {
		extend()
		err := conn.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(s.cfg.WriteTimeout))
		if errors.Is(err, websocket.ErrCloseSent) {
			return nil
		}
		return err
	})
	conn.SetPongHandler(func(string) error { extend(); return nil })
	readErr := make(chan error, 1)
	go func() { readErr <- s.readAcks(conn, extend) }()
	var lastSent uint64 // every unacknowledged batch is resent on a new connection
	defer func() {
		_ = conn.Close()
		err := <-readErr // the reader has stopped touching s
		s.dropRefused(err, lastSent)
	}()

	ping := time.NewTicker(s.cfg.PingInterval)
	defer ping.Stop()
	closing := s.closing
	for {
		for {
			b, err := s.nextToSend(lastSent)
			if err != nil {
				return true, err
			}
			if b == nil {
				break
			}
			if err := s.writeFrame(conn, b.frame); err != nil {
				return true, fmt.Errorf("send batch %d: %w", b.seq, err)
			}
			lastSent = b.seq
			s.mu.Lock()
			s.stats.Sends++
			s.mu.Unlock()
		}
		if s.flushed() {
			msg := websocket.FormatCloseMessage(websocket.CloseNormalClosure, "agent stopping")
			_ = conn.WriteControl(websocket.CloseMessage, msg, time.Now().Add(s.cfg.WriteTimeout))
			return true, errFlushed
		}
		select {
		case <-s.wake:
		case <-closing:
			closing = nil // checked by flushed from now on
		case err := <-readErr:
			readErr <- err // for the deferred wait
			return true, err
		case <-ping.C:
			if err := conn.WriteControl(websocket.PingMessage, nil, time.Now().Add(s.cfg.WriteTimeout)); err != nil {
				return true, fmt.Errorf("ping: %w", err)
			}
		case <-s.hardStop.Done():
			return true, s.hardStop.Err()
		}
	}
}

func (s *Shipper) writeFrame(conn *websocket.Conn, b []byte) error {
	if err := conn.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout)); err != nil {
		return err
	}
	return conn.WriteMessage(websocket.BinaryMessage, b)
}

// readAcks is the session's only reader after the welcome.
func (s *Shipper) readAcks(conn *websocket.Conn, extend func()) error {
	for {
		env, err := readEnvelope(conn)
		if err != nil {
			return err
		}
		extend()
		if a := env.GetAck(); a != nil {
			s.acked(a.GetSeq())
		}
		// Other bodies (from a newer collector) are ignored.
	}
}

// dropRefused drops the oldest unacknowledged batch, counting its records as dropped,
// when the collector closed the stream refusing it: BAD_FRAME (too many records, or
// lines that would outgrow the frame) or 1009 (over its frame limit). The collector
// handles batches in order and acknowledges each before reading the next, so the one
// refused is the oldest not acknowledged; resent, it would be refused for ever and
// hold every later record back. Only a batch sent on this connection can have been
// refused.
func (s *Shipper) dropRefused(err error, lastSent uint64) {
	var ce *websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != int(pb.CloseCode_CLOSE_CODE_BAD_FRAME) && ce.Code != websocket.CloseMessageTooBig {
		return
	}
	s.mu.Lock()
	if len(s.unacked) == 0 || s.unacked[0].seq > lastSent {
		s.mu.Unlock()
		return
	}
	b := s.unacked[0]
	s.unacked[0] = nil
	s.unacked = s.unacked[1:]
	s.held -= b.bytes
	s.stats.Dropped += uint64(b.records)
	s.mu.Unlock()
	s.signal() // the count must travel even if nothing is logged after it
	s.log.Warn().Uint64("seq", b.seq).Int("records", b.records).Int("close_code", ce.Code).Str("reason", ce.Text).
		Msg("the collector refused a log batch; its records are dropped, not resent")
}

func readEnvelope(conn *websocket.Conn) (*pb.LogEnvelope, error) {
	kind, data, err := conn.ReadMessage()
	if err != nil {
		var ce *websocket.CloseError
		if errors.As(err, &ce) {
			return nil, fmt.Errorf("collector closed the stream: %w", ce)
		}
		return nil, err
	}
	if kind != websocket.BinaryMessage {
		return nil, fmt.Errorf("websocket message type %d from the collector, want binary", kind)
	}
	env := new(pb.LogEnvelope)
	if err := (proto.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(data, env); err != nil {
		return nil, fmt.Errorf("bad frame from the collector: %w", err)
	}
	return env, nil
}

func dialError(resp *http.Response, err error) error {
	if resp == nil {
		return fmt.Errorf("dial: %w", err)
	}
	var body []byte
	if resp.Body != nil {
		body, _ = io.ReadAll(io.LimitReader(resp.Body, 512))
		_ = resp.Body.Close()
	}
	return fmt.Errorf("dial: upgrade refused with HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(body)))
}
