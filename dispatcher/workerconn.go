package dispatcher

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	"github.com/labstack/echo/v4"
	"github.com/rs/zerolog"

	"github.com/smartroute/smartroute/proto/credential"
	"github.com/smartroute/smartroute/proto/frame"
	pb "github.com/smartroute/smartroute/proto/smartroutev1"
)

// Disconnect is why the dispatcher ended a worker connection. Its code is sent in the
// WebSocket close frame; the agent decides from it whether to reconnect.
type Disconnect struct {
	Code   pb.CloseCode
	Reason string
}

func (d *Disconnect) Error() string { return fmt.Sprintf("%s: %s", d.Code, d.Reason) }

// workerConn is one worker's WebSocket. The reader goroutine owns reads. Frames are
// written by a flusher goroutine that exists only while frames are pending, so an
// idle connection costs one goroutine, not two; pings (from the dispatcher's single
// pinger) and the close frame use WriteControl, which gorilla allows beside a
// writer. Other goroutines talk to a connection only through send, ping and close,
// which never block.
type workerConn struct {
	id          string
	agent       string
	connectedAt time.Time
	ws          *websocket.Conn
	// batch is the socket under ws; the flusher gathers a batch of frames into one
	// write through it.
	batch *frame.BatchConn
	// credential is the hash of the worker token it authenticated with (zero when
	// worker auth is off); a reload that revokes it closes the connection.
	credential credential.Hash
	// drained is set (under hub.mu) once the hub has sent it a Drain: a status saying
	// it accepts, sent before the Drain reached it, must not put it back in the routing.
	drained bool
	// loadable is what its backend can load, sorted, as its hello or last Inventory
	// said (nil: any label); set under hub.mu and never changed in place, so the
	// detail view shares it rather than copy it under the lock.
	loadable []string
	// hub is the hub it registers with; close takes it out of the routing there.
	hub *hub
	// log is the dispatcher's logger; records add worker_id themselves, because a
	// child logger per connection would hold a few hundred bytes for its lifetime.
	log zerolog.Logger

	// pending holds encoded frames for the flusher, bounded by maxQueued. It is a slice
	// rather than a buffered channel so that an idle worker costs no queue memory
	// (a 1024-slot channel alone is 24 KiB per connection). Appended by the hub, under
	// hub.mu (the Welcome too, in addWorker); taken by the flusher. flushing
	// says a flusher runs; only one ever does, which makes it the only writer.
	pendingMu    sync.Mutex
	pending      [][]byte
	flushing     bool
	flushedCh    chan struct{} // closed when the flusher next finds the queue empty; made on demand
	maxQueued    int
	writeTimeout time.Duration

	// pinging is set while a ping to it is being written (Dispatcher.pingWorkers).
	pinging atomic.Bool

	closeOnce sync.Once
	closing   chan struct{} // closed by close
	reason    *Disconnect   // set once, before closing is closed
	written   chan struct{} // closed once the close frame is out and the socket closed
	read      chan struct{} // closed when the reader goroutine has ended
}

// done is closed once both of the connection's goroutines have ended.
func (wc *workerConn) done() <-chan struct{} {
	ch := make(chan struct{})
	go func() { <-wc.written; <-wc.read; close(ch) }()
	return ch
}

// send queues a frame without blocking. A worker whose queue is full is too slow to
// keep up and is disconnected: the scheduler must never wait on a socket.
func (wc *workerConn) send(b []byte) {
	wc.pendingMu.Lock()
	full := len(wc.pending) >= wc.maxQueued
	start := false
	if !full {
		wc.pending = append(wc.pending, b)
		start = !wc.flushing
		wc.flushing = true
	}
	wc.pendingMu.Unlock()
	if full {
		wc.close(&Disconnect{Code: pb.CloseCode_CLOSE_CODE_SLOW_WORKER, Reason: fmt.Sprintf("send queue full (%d frames)", wc.maxQueued)})
		return
	}
	if start {
		go wc.flush()
	}
}

// flush writes pending frames until none are left, then ends: the only goroutine that
// calls WriteMessage. It leaves an idle connection with no queue memory.
func (wc *workerConn) flush() {
	// Let the request goroutines that are about to queue assignments for this worker
	// run first, so that they leave in this write: without it, batching depended on
	// whether an idle P happened to start the flusher at once.
	runtime.Gosched()
	for {
		wc.pendingMu.Lock()
		batch := wc.pending
		wc.pending = nil
		if len(batch) == 0 || wc.isClosing() {
			wc.flushing = false
			if wc.flushedCh != nil {
				close(wc.flushedCh)
				wc.flushedCh = nil
			}
			wc.pendingMu.Unlock()
			return
		}
		wc.pendingMu.Unlock()
		if len(batch) > 1 {
			wc.batch.Hold() // one write for the lot
		}
		wc.ws.SetWriteDeadline(time.Now().Add(wc.writeTimeout))
		for _, b := range batch {
			if wc.isClosing() {
				break // a closing connection sends nothing more: its tasks are requeued
			}
			if err := wc.ws.WriteMessage(websocket.BinaryMessage, b); err != nil {
				wc.close(&Disconnect{Code: pb.CloseCode_CLOSE_CODE_UNSPECIFIED, Reason: "write: " + err.Error()})
				break
			}
		}
		if err := wc.batch.Flush(); err != nil {
			wc.close(&Disconnect{Code: pb.CloseCode_CLOSE_CODE_UNSPECIFIED, Reason: "write: " + err.Error()})
		}
	}
}

// closedChan is flushed's answer when nothing waits to be written.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// flushed returns a channel that is closed once the frames queued so far are written
// (or the connection is closing and will write no more).
func (wc *workerConn) flushed() <-chan struct{} {
	wc.pendingMu.Lock()
	defer wc.pendingMu.Unlock()
	if !wc.flushing {
		return closedChan
	}
	if wc.flushedCh == nil {
		wc.flushedCh = make(chan struct{})
	}
	return wc.flushedCh
}

// batchingHijacker hands the upgrader a BatchConn around the hijacked socket.
type batchingHijacker struct {
	http.ResponseWriter
	conn *frame.BatchConn
}

func (h *batchingHijacker) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	nc, brw, err := http.NewResponseController(h.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	h.conn = frame.NewBatchConn(nc)
	return h.conn, brw, nil
}

// ping sends a WebSocket ping; the reader's deadline, which pongs extend, notices a
// worker that stopped answering. A ping that cannot be written within a second means
// the connection is congested; the next one will try again. It can wait longer: behind
// a batch the flusher is writing to a socket that has stopped draining, up to the
// batch's WriteTimeout.
func (wc *workerConn) ping() {
	if wc.isClosing() {
		return
	}
	_ = wc.ws.WriteControl(websocket.PingMessage, nil, time.Now().Add(time.Second))
}

func (wc *workerConn) isClosing() bool {
	select {
	case <-wc.closing:
		return true
	default:
		return false
	}
}

// close ends the connection with a reason; only the first call counts.
func (wc *workerConn) close(d *Disconnect) {
	wc.closeOnce.Do(func() {
		wc.reason = d
		close(wc.closing)
		// The close frame may wait up to the write timeout: never on the caller (the
		// hub calls close under its lock).
		go func() {
			// Out of the routing first, here since the caller may hold hub.mu. The reader
			// would remove it only once the socket is closed, after the close frame, which
			// on a socket that stopped draining (the usual SLOW_WORKER) waits out the write
			// timeout: meanwhile its tasks, and new ones routed to it, would wait for
			// nothing.
			if wc.hub != nil {
				wc.hub.removeWorker(wc)
			}
			writeClose(wc.ws, d, wc.writeTimeout)
			// A flusher in the middle of a batch holds the socket's writes, the close
			// frame's included: send them before closing, or the worker never learns
			// the close code. Gorilla refuses data frames after a close frame, so the
			// batch ends with it.
			_ = wc.batch.Flush()
			wc.ws.Close() // also ends the reader's ReadMessage and a flusher's write
			close(wc.written)
		}()
	})
}

var upgrader = websocket.Upgrader{
	HandshakeTimeout: 10 * time.Second,
	// Frames stream through the read buffer; they need not fit in it. A small one keeps
	// idle connections cheap (net/http's 4 KiB one would be reused otherwise).
	ReadBufferSize: 1024,
	// Idle workers hold no write buffer: frames borrow one from the pool while being
	// written, which keeps thousands of idle connections cheap.
	WriteBufferPool: &sync.Pool{},
	// Workers are programs, not browsers; credentials (not the origin) say who may
	// connect.
	CheckOrigin: func(*http.Request) bool { return true },
	Error:       upgradeError,
}

// upgradeError answers a request the upgrader refuses (not a WebSocket handshake, an
// unknown WebSocket version) in JSON like every other error, rather than with
// gorilla's "Bad Request" in plain text; the version header is what gorilla sends.
func upgradeError(w http.ResponseWriter, _ *http.Request, status int, reason error) {
	w.Header().Set("Sec-Websocket-Version", "13")
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(errorBody{reason.Error()})
}

// serveWorker is the /worker-listen handler and the connection's reader.
func (d *Dispatcher) serveWorker(c echo.Context) error {
	id := c.Request().Header.Get("Worker-Id")
	if id == "" {
		return c.JSON(http.StatusBadRequest, errorBody{"the Worker-Id header is required"})
	}
	if err := checkName("Worker-Id", id, maxIDLength, true); err != nil {
		return c.JSON(http.StatusBadRequest, errorBody{err.Error()})
	}
	hj := &batchingHijacker{ResponseWriter: c.Response()}
	ws, err := upgrader.Upgrade(hj, c.Request(), nil)
	if err != nil {
		return nil // the upgrader has answered the client already
	}
	cfg := d.cfg
	wc := &workerConn{
		id:           id,
		connectedAt:  time.Now(),
		ws:           ws,
		batch:        hj.conn,
		hub:          d.hub,
		log:          d.log,
		maxQueued:    cfg.SendQueueFrames,
		credential:   workerCredential(c),
		writeTimeout: cfg.WriteTimeout,
		closing:      make(chan struct{}),
		written:      make(chan struct{}),
		read:         make(chan struct{}),
	}
	ws.SetReadLimit(cfg.MaxFrameBytes)

	hello, err := d.readHello(wc)
	if err != nil {
		var disc *Disconnect
		if !errors.As(err, &disc) {
			disc = &Disconnect{Code: pb.CloseCode_CLOSE_CODE_BAD_FRAME, Reason: err.Error()}
		}
		wc.log.Warn().Str("worker_id", id).Err(err).Msg("worker refused at hello")
		d.hub.met.disconnected(disc.Code)
		writeClose(ws, disc, cfg.WriteTimeout)
		ws.Close()
		close(wc.read)
		return nil
	}
	wc.agent = hello.GetAgent()

	// The welcome is the first frame out, ahead of any assignment; addWorker queues it
	// as it registers the worker.
	welcome, _ := frame.Encode(nil, &pb.Envelope{Body: &pb.Envelope_Welcome{Welcome: &pb.Welcome{
		ProtocolVersion: frame.ProtocolVersion, DispatcherId: d.id, MaxFrameBytes: uint64(cfg.MaxFrameBytes),
		InventoryUpdates: true}}})
	if err := d.hub.addWorker(wc, hello, welcome); err != nil {
		var disc *Disconnect
		if !errors.As(err, &disc) {
			disc = &Disconnect{Code: pb.CloseCode_CLOSE_CODE_BAD_FRAME, Reason: err.Error()}
		}
		d.hub.met.disconnected(disc.Code) // before the close frame, as at the hello
		wc.close(disc)
		<-wc.written
		close(wc.read)
		return nil
	}
	if why := d.auth.workerRevoked(wc.credential, wc.id); why != nil { // revoked while it said hello
		d.hub.removeWorker(wc)
		wc.close(why)
	}
	wc.log.Info().Str("worker_id", id).Uint32("max_labels", hello.GetMaxLabels()).Uint32("slots", hello.GetSlots()).
		Strs("labels", hello.GetHeldLabels()).Str("agent", wc.agent).Msg("worker connected")

	// The reader gets a goroutine of its own and the HTTP handler returns: the
	// handler's stack, grown through net/http and Echo, and its request state would
	// otherwise stay pinned for the life of the connection.
	go func() {
		defer close(wc.read)
		reason := d.readLoop(wc)
		d.hub.removeWorker(wc)
		wc.close(reason)
		d.hub.met.disconnected(wc.reason.Code)
		<-wc.written
		wc.log.Info().Str("worker_id", wc.id).Str("reason", wc.reason.Reason).Str("code", wc.reason.Code.String()).Msg("worker disconnected")
	}()
	return nil
}

func (d *Dispatcher) readHello(wc *workerConn) (*pb.Hello, error) {
	ws := wc.ws
	ws.SetReadDeadline(time.Now().Add(d.cfg.HelloTimeout))
	kind, b, err := ws.ReadMessage()
	if err != nil {
		var ne interface{ Timeout() bool }
		if errors.As(err, &ne) && ne.Timeout() {
			return nil, &Disconnect{Code: pb.CloseCode_CLOSE_CODE_HELLO_TIMEOUT, Reason: "no hello within " + d.cfg.HelloTimeout.String()}
		}
		return nil, fmt.Errorf("read hello: %w", err)
	}
	if kind != websocket.BinaryMessage {
		return nil, errors.New("frames must be binary protobuf envelopes")
	}
	env, err := frame.Decode(b, int(d.cfg.MaxFrameBytes))
	if err != nil {
		return nil, err
	}
	hello, err := frame.CheckHello(env, wc.id)
	var verr *frame.VersionError
	if errors.As(err, &verr) {
		return nil, &Disconnect{Code: pb.CloseCode_CLOSE_CODE_PROTOCOL_VERSION, Reason: verr.Error()}
	}
	return hello, err
}

// readLoop reads frames until the connection ends and returns why it ended.
func (d *Dispatcher) readLoop(wc *workerConn) *Disconnect {
	ws := wc.ws
	pongWait := d.cfg.PingInterval * 5 / 2
	deadline := frame.NewReadDeadline(ws.SetReadDeadline)
	deadline.Extend(pongWait)
	ws.SetPongHandler(func(string) error { return deadline.Extend(pongWait) })
	readFailed := func(err error) *Disconnect {
		if ce := (*websocket.CloseError)(nil); errors.As(err, &ce) {
			return &Disconnect{Code: pb.CloseCode(ce.Code), Reason: "worker closed: " + ce.Text}
		}
		return &Disconnect{Code: pb.CloseCode_CLOSE_CODE_UNSPECIFIED, Reason: "read: " + err.Error()}
	}
	env := new(pb.Envelope)
	for {
		kind, r, err := ws.NextReader()
		if err != nil {
			return readFailed(err)
		}
		deadline.Extend(pongWait)
		if kind != websocket.BinaryMessage {
			return &Disconnect{Code: pb.CloseCode_CLOSE_CODE_BAD_FRAME, Reason: "frames must be binary protobuf envelopes"}
		}
		// No env.Reset here: ReadInto resets env itself but keeps a result's message
		// and bytes for the next result to be decoded into.
		if _, err := frame.ReadInto(r, int(d.cfg.MaxFrameBytes), env); err != nil {
			var re *frame.ReadError
			if errors.As(err, &re) {
				return readFailed(re.Err)
			}
			return &Disconnect{Code: pb.CloseCode_CLOSE_CODE_BAD_FRAME, Reason: err.Error()}
		}
		switch body := env.Body.(type) {
		case *pb.Envelope_Result:
			d.hub.onResult(wc, body.Result)
		case *pb.Envelope_LabelEvent:
			if err := frame.CheckLabel("label event's label", body.LabelEvent.GetLabel()); err != nil {
				return &Disconnect{Code: pb.CloseCode_CLOSE_CODE_BAD_FRAME, Reason: err.Error()}
			}
			d.hub.onLabelEvent(wc, body.LabelEvent)
		case *pb.Envelope_Status:
			d.hub.onStatus(wc, body.Status)
		case *pb.Envelope_Inventory:
			if err := frame.CheckLabels("inventory loadable_labels", body.Inventory.GetLoadableLabels()); err != nil {
				return &Disconnect{Code: pb.CloseCode_CLOSE_CODE_BAD_FRAME, Reason: err.Error()}
			}
			d.hub.onInventory(wc, body.Inventory)
		default:
			return &Disconnect{Code: pb.CloseCode_CLOSE_CODE_BAD_FRAME, Reason: fmt.Sprintf("unexpected %T from a worker", body)}
		}
		select {
		case <-wc.closing:
			return wc.reason
		default:
		}
	}
}

func writeClose(ws *websocket.Conn, d *Disconnect, timeout time.Duration) {
	code := int(d.Code)
	if code < 1000 {
		code = websocket.CloseNormalClosure
	}
	_ = ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, frame.CloseReason(d.Reason)), time.Now().Add(timeout))
}
