package agent

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/gorilla/websocket"
	"github.com/rs/zerolog"

	"github.com/smartroute/smartroute/proto/frame"
	pb "github.com/smartroute/smartroute/proto/smartroutev1"
)

var (
	errQueueFull     = errors.New("outgoing frame queue full: the dispatcher is not reading")
	errClosedByAgent = errors.New("connection closed by the agent")
)

// closeWait bounds how long a normal close waits for the dispatcher's close reply.
const closeWait = 2 * time.Second

// session is one WebSocket connection to the dispatcher. After the handshake it has
// one reader (agent.readLoop) and one writer (writeLoop); everyone else hands frames
// to the writer through send, which never blocks.
type session struct {
	id   uint64
	conn *websocket.Conn
	log  zerolog.Logger

	writeTimeout time.Duration
	readTimeout  time.Duration
	pingInterval time.Duration
	// readDeadline is the reader's: readFrame and the ping and pong handlers, which
	// gorilla runs inside the reader's calls.
	readDeadline *frame.ReadDeadline

	// out holds frames for the writer: any goroutine sends (without blocking), only
	// writeLoop receives.
	out chan *pb.Envelope
	// closeReq asks writeLoop to flush out and send a normal close frame. Buffered 1.
	closeReq chan struct{}
	// done is closed by end, once, when the session is over.
	done    chan struct{}
	endOnce sync.Once
	err     error // why the session ended; written by end before done is closed

	wg sync.WaitGroup // the reader and the writer

	tasks int // attempts assigned on this session holding a slot; guarded by agent.mu
	// inventoryUpdates: the dispatcher's Welcome said it takes Inventory frames. Set
	// after the Welcome; guarded by agent.mu.
	inventoryUpdates bool

	// maxFrame is the largest frame this session sends: the agent's MaxFrameSize, or
	// the dispatcher's read limit from the Welcome when that is smaller (lowered before
	// the reader starts).
	maxFrame int

	// welcomeMu guards welcomed and onEnd: a send that finds the queue full ends the
	// session from another goroutine, possibly while the handshake marks it welcomed.
	welcomeMu sync.Mutex
	welcomed  bool   // the dispatcher's Welcome came: the agent can take tasks
	onEnd     func() // set with welcomed; end calls it once (metrics)
}

func newSession(id uint64, conn *websocket.Conn, cfg *Config, log zerolog.Logger) *session {
	s := &session{
		id:           id,
		conn:         conn,
		log:          log.With().Uint64("conn", id).Logger(),
		writeTimeout: cfg.WriteTimeout,
		readTimeout:  cfg.ReadTimeout,
		pingInterval: cfg.PingInterval,
		maxFrame:     cfg.MaxFrameSize,
		out:          make(chan *pb.Envelope, cfg.SendQueueSize),
		closeReq:     make(chan struct{}, 1),
		done:         make(chan struct{}),
	}
	s.readDeadline = frame.NewReadDeadline(conn.SetReadDeadline)
	conn.SetReadLimit(int64(cfg.MaxFrameSize))
	// Any sign of life from the dispatcher extends the read deadline.
	conn.SetPingHandler(func(data string) error {
		s.extendReadDeadline()
		err := conn.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(s.writeTimeout))
		if errors.Is(err, websocket.ErrCloseSent) {
			return nil
		}
		return err
	})
	conn.SetPongHandler(func(string) error {
		s.extendReadDeadline()
		return nil
	})
	return s
}

func (s *session) extendReadDeadline() {
	_ = s.readDeadline.Extend(s.readTimeout)
}

// send queues env for the writer. It never blocks: on a session that is over it drops
// env, and a full queue ends the session (the dispatcher re-queues its tasks).
func (s *session) send(env *pb.Envelope) bool {
	if s == nil {
		return false
	}
	select {
	case <-s.done:
		return false
	default:
	}
	select {
	case s.out <- env:
		return true
	default:
		s.log.Warn().Int("queue_size", cap(s.out)).Msg("outgoing queue full, dropping the connection")
		s.end(errQueueFull)
		return false
	}
}

// end finishes the session with err; only the first call counts.
func (s *session) end(err error) {
	s.endOnce.Do(func() {
		s.err = err
		close(s.done)
		_ = s.conn.Close()
		s.welcomeMu.Lock()
		onEnd := s.onEnd
		s.welcomed = false
		s.welcomeMu.Unlock()
		if onEnd != nil {
			onEnd()
		}
	})
}

// markWelcomed records the Welcome, with what end must undo; false when the session
// ended first, and then onEnd is not kept.
func (s *session) markWelcomed(onEnd func()) bool {
	s.welcomeMu.Lock()
	defer s.welcomeMu.Unlock()
	if s.ended() {
		return false
	}
	s.welcomed, s.onEnd = true, onEnd
	return true
}

// isWelcomed says whether the session is past its handshake and not over.
func (s *session) isWelcomed() bool {
	s.welcomeMu.Lock()
	defer s.welcomeMu.Unlock()
	return s.welcomed
}

// ended reports whether the session is over.
func (s *session) ended() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// setWriteDeadline gives the frames written next (until the next call) WriteTimeout
// from now. The writer sets it once for the frames it writes together: a clock read
// per frame was a tenth of the agent's clock reads per task, for deadlines that
// differ by the microseconds it takes to gather the frames.
func (s *session) setWriteDeadline() error {
	return s.conn.SetWriteDeadline(time.Now().Add(s.writeTimeout))
}

// write sends one frame under the deadline setWriteDeadline last set, reusing buf for
// the encoding.
func (s *session) write(env *pb.Envelope, buf []byte) ([]byte, error) {
	b, err := frame.Encode(buf[:0], env)
	if err != nil {
		return buf, fmt.Errorf("encode %T: %w", env.GetBody(), err)
	}
	if err := s.conn.WriteMessage(websocket.BinaryMessage, b); err != nil {
		return b, err
	}
	if e := s.log.Debug(); e.Enabled() {
		e.Str("frame", fmt.Sprintf("%T", env.GetBody())).Int("bytes", len(b)).Msg("frame sent")
	}
	return b, nil
}

// maxBatch bounds the frames the writer gathers into one write.
const maxBatch = 64

// writeLoop is the only goroutine that writes data frames after the handshake.
func (s *session) writeLoop() {
	defer s.wg.Done()
	ping := time.NewTicker(s.pingInterval)
	defer ping.Stop()
	// Over plain TCP the socket is a BatchConn (see dialBatching): results that are
	// queued together leave in one write. Under TLS each frame is its own write.
	batch, _ := s.conn.NetConn().(*frame.BatchConn)
	var buf []byte
	var err error
	for {
		select {
		case env := <-s.out:
			if len(s.out) == 0 && batch != nil {
				// Let the task goroutines that are about to queue their results run
				// first, so that they leave in this write rather than one write each.
				// Without this, whether results batched depended on whether an idle P
				// woke this goroutine at once: under load the agent flipped between
				// ~0.3 and ~1 write per task, and the dispatcher's reads followed.
				runtime.Gosched()
			}
			err = s.setWriteDeadline()
			if n := len(s.out); n > 0 && batch != nil && err == nil {
				batch.Hold()
				for range min(n, maxBatch-1) { // only this goroutine receives: never blocks
					if buf, err = s.write(env, buf); err != nil {
						break
					}
					env = <-s.out
				}
			}
			if err == nil {
				buf, err = s.write(env, buf)
			}
			if batch != nil && err == nil {
				err = batch.Flush()
			}
			if err != nil {
				s.end(fmt.Errorf("write: %w", err))
				return
			}
		case <-ping.C:
			if err := s.conn.WriteControl(websocket.PingMessage, nil, time.Now().Add(s.writeTimeout)); err != nil {
				s.end(fmt.Errorf("ping: %w", err))
				return
			}
		case <-s.closeReq:
			for len(s.out) > 0 { // only this goroutine receives, so this never blocks
				// Each its own write, and its own deadline: a dispatcher slow to read
				// has WriteTimeout for every frame, as in a batch, not for them all.
				if err = s.setWriteDeadline(); err == nil {
					buf, err = s.write(<-s.out, buf)
				}
				if err != nil {
					s.end(fmt.Errorf("write: %w", err))
					return
				}
			}
			msg := websocket.FormatCloseMessage(websocket.CloseNormalClosure, "worker draining")
			if err := s.conn.WriteControl(websocket.CloseMessage, msg, time.Now().Add(s.writeTimeout)); err != nil {
				s.end(fmt.Errorf("write close: %w", err))
			}
			return
		case <-s.done:
			return
		}
	}
}

// closeNormally flushes the queued frames, sends a normal close frame, waits up to
// closeWait for the dispatcher's reply, and ends the session. It returns once the
// reader and the writer have stopped.
func (s *session) closeNormally() {
	select {
	case s.closeReq <- struct{}{}:
	default:
	}
	t := time.NewTimer(closeWait)
	select {
	case <-s.done:
	case <-t.C:
		s.log.Info().Msg("no close reply from the dispatcher")
	}
	t.Stop()
	s.end(errClosedByAgent)
	s.wg.Wait()
}

// closeWith sends a close frame with code and reason, then ends the session with err.
func (s *session) closeWith(code int, reason string, err error) {
	msg := websocket.FormatCloseMessage(code, frame.CloseReason(reason))
	_ = s.conn.WriteControl(websocket.CloseMessage, msg, time.Now().Add(s.writeTimeout))
	// The writer may be holding a batch, this close frame included: send it before
	// the socket closes.
	if batch, ok := s.conn.NetConn().(*frame.BatchConn); ok {
		_ = batch.Flush()
	}
	s.end(err)
}

// assignmentFrame is an envelope with an assignment body, in one allocation rather
// than three: nearly every frame an agent reads is an assignment, and the decoder
// fills the body it finds in place (another kind of frame replaces it).
type assignmentFrame struct {
	env  pb.Envelope
	body pb.Envelope_Assignment
	asg  pb.TaskAssignment
}

// readFrame reads and decodes the next frame under the read deadline. Errors that are
// the dispatcher's fault come back as *protocolError; close frames as *CloseError. A
// nil envelope with a nil error is a frame to skip.
func (s *session) readFrame(maxSize int, timeout time.Duration) (*pb.Envelope, error) {
	_ = s.readDeadline.Extend(timeout)
	kind, r, err := s.conn.NextReader()
	if err != nil {
		return nil, asCloseError(err)
	}
	if kind != websocket.BinaryMessage {
		return nil, &protocolError{msg: fmt.Sprintf("websocket message type %d, want binary", kind)}
	}
	f := new(assignmentFrame)
	f.body.Assignment = &f.asg
	env := &f.env
	env.Body = &f.body
	n, err := frame.ReadInto(r, maxSize, env)
	if err != nil {
		// Declared in here: errors.As moves its target to the heap, an allocation
		// each time the declaration runs.
		var re *frame.ReadError
		switch {
		case errors.As(err, &re):
			return nil, asCloseError(re.Err)
		case errors.Is(err, frame.ErrNoBody):
			// Fields are only ever added to the protocol: a body this build does not know
			// comes from a newer dispatcher and is skipped rather than treated as garbage.
			s.log.Warn().Int("bytes", n).Msg("skipping a frame with no body this worker knows")
			return nil, nil
		default:
			return nil, &protocolError{msg: err.Error()}
		}
	}
	if e := s.log.Debug(); e.Enabled() {
		e.Str("frame", fmt.Sprintf("%T", env.GetBody())).Int("bytes", n).Msg("frame received")
	}
	return env, nil
}
