package logcollector

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/gorilla/websocket"
	"github.com/labstack/echo/v4"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/smartroute/smartroute/proto/credential"
	"github.com/smartroute/smartroute/proto/frame"
	pb "github.com/smartroute/smartroute/proto/smartroutev1"
)

var upgrader = websocket.Upgrader{
	HandshakeTimeout: 10 * time.Second,
	// Frames stream through the read buffer; they need not fit in it. A small one keeps
	// idle streams cheap (net/http's 4 KiB one would be reused otherwise).
	ReadBufferSize:  1024,
	WriteBufferPool: &sync.Pool{},
	// Agents are programs, not browsers.
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

// Limits of a hello's free-form fields; agents send 16 hex digits and a short version.
// maxHelloBytes bounds the whole hello frame, read before the stream holds a batch slot.
const (
	maxStreamIDBytes = 128
	maxAgentBytes    = 256
	maxHelloBytes    = 4 << 10
)

// Bounds of what one batch may cost beyond its frame. maxBatchRecords is ten times
// the records the agent's shipper puts in a batch (logship.DefaultBatchRecords).
// Its lines may come to batchGrowth times the frame plus batchSlack: JSON records are
// written as sent (at most three times as long where invalid UTF-8 is replaced) and
// the collector's notes fit in the slack; only the wrapping of records that are not
// JSON objects grows more, and a frame of many tiny such records is refused.
const (
	maxBatchRecords = 10_000
	batchGrowth     = 4
	batchSlack      = 64 << 10
)

// Frame errors: a frame that cannot be used closes the stream with BAD_FRAME.
var (
	errEmptyFrame = errors.New("empty frame")
	errNoBody     = errors.New("log envelope has no body")
)

// decodeLogFrame parses one ingest frame. It refuses what no agent sends: an empty or
// oversized frame, a malformed one, one with no body this collector knows, or a batch
// of more than maxBatchRecords records, counted before anything is decoded: each
// record costs a slice header and a line, two bytes of frame do not.
func decodeLogFrame(b []byte, maxSize int) (*pb.LogEnvelope, error) {
	switch {
	case len(b) == 0:
		return nil, errEmptyFrame
	case len(b) > maxSize:
		return nil, fmt.Errorf("frame of %d bytes exceeds the limit of %d", len(b), maxSize)
	}
	if n := countBatchRecords(b); n > maxBatchRecords {
		return nil, fmt.Errorf("batch of %d records exceeds the limit of %d", n, maxBatchRecords)
	}
	env := new(pb.LogEnvelope)
	if err := (proto.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(b, env); err != nil {
		return nil, fmt.Errorf("malformed frame: %w", err)
	}
	if env.Body == nil {
		return nil, errNoBody
	}
	return env, nil
}

// Field numbers of LogEnvelope.batch and LogBatch.records (logs.proto).
const (
	envelopeBatchField = 2
	batchRecordsField  = 2
)

// countBatchRecords counts the records of the batches in an encoded LogEnvelope
// without decoding them: every occurrence of the batch field, which proto merges. A
// malformed frame counts what precedes the damage; Unmarshal then refuses it.
func countBatchRecords(b []byte) int {
	n := 0
	for len(b) > 0 {
		num, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return n
		}
		b = b[l:]
		if num == envelopeBatchField && typ == protowire.BytesType {
			batch, l := protowire.ConsumeBytes(b)
			if l < 0 {
				return n
			}
			b = b[l:]
			for len(batch) > 0 {
				num, typ, l := protowire.ConsumeTag(batch)
				if l < 0 {
					return n
				}
				batch = batch[l:]
				if num == batchRecordsField && typ == protowire.BytesType {
					n++
				}
				if l = protowire.ConsumeFieldValue(num, typ, batch); l < 0 {
					return n
				}
				batch = batch[l:]
			}
			continue
		}
		if l = protowire.ConsumeFieldValue(num, typ, b); l < 0 {
			return n
		}
		b = b[l:]
	}
	return n
}

// ingestConn is one agent's stream. Its goroutine (runStream) is the only reader and
// the only writer of data frames (welcome, acks); the collector's pinger writes
// control frames only, which gorilla allows concurrently. Records name worker_id
// themselves: a child logger per stream would hold a few hundred bytes for its life.
type ingestConn struct {
	worker string
	ws     *websocket.Conn

	writeTimeout time.Duration
	done         chan struct{} // closed by closeWith, once
	once         sync.Once
	pinging      atomic.Bool // a ping to it is being written
}

// closeWith sends a close frame (best effort) and closes the connection. Idempotent,
// safe from any goroutine.
func (ic *ingestConn) closeWith(code int, reason string) {
	ic.closeBy(code, reason, time.Now().Add(ic.writeTimeout))
}

// closeBy is closeWith giving the close frame until deadline: an agent that stopped
// reading holds the write that long.
func (ic *ingestConn) closeBy(code int, reason string, deadline time.Time) {
	ic.once.Do(func() {
		// done first: once the agent can read the close frame, nothing more of its
		// stream is written (a batch waiting for a slot checks done when it gets one).
		close(ic.done)
		msg := websocket.FormatCloseMessage(code, frame.CloseReason(reason))
		_ = ic.ws.WriteControl(websocket.CloseMessage, msg, deadline)
		_ = ic.ws.Close()
	})
}

func (ic *ingestConn) write(env *pb.LogEnvelope) error {
	b, err := proto.Marshal(env)
	if err != nil {
		return err
	}
	if err := ic.ws.SetWriteDeadline(time.Now().Add(ic.writeTimeout)); err != nil {
		return err
	}
	return ic.ws.WriteMessage(websocket.BinaryMessage, b)
}

// streamError ends a stream with a close code.
type streamError struct {
	code   pb.CloseCode
	reason string
}

func (e *streamError) Error() string { return e.reason }

func badFrame(format string, args ...any) error {
	return &streamError{code: pb.CloseCode_CLOSE_CODE_BAD_FRAME, reason: fmt.Sprintf(format, args...)}
}

// ingest is the /ingest handler: it validates the Worker-Id, upgrades, and serves
// the stream until it ends.
func (c *Collector) ingest(ctx echo.Context) error {
	id := ctx.Request().Header.Get("Worker-Id")
	if id == "" {
		return ctx.JSON(http.StatusBadRequest, errorBody{"the Worker-Id header is required"})
	}
	if err := frame.CheckWorkerIDField("Worker-Id", id); err != nil {
		return ctx.JSON(http.StatusBadRequest, errorBody{err.Error()})
	}
	if c.ingestTokens != nil {
		tok, ok := credential.BearerToken(ctx.Request().Header.Get("Authorization"))
		if !ok || !c.ingestTokens.Holds(credential.Sum(tok)) {
			ctx.Response().Header().Set("WWW-Authenticate", `Bearer realm="smartroute"`)
			return ctx.JSON(http.StatusUnauthorized, errorBody{"ingest token missing or refused: send Authorization: Bearer <worker token>"})
		}
	}
	c.mu.Lock()
	if c.stopping {
		c.mu.Unlock()
		return ctx.JSON(http.StatusServiceUnavailable, errorBody{"the log collector is shutting down"})
	}
	c.handlers.Add(1)
	c.mu.Unlock()

	ws, err := upgrader.Upgrade(ctx.Response(), ctx.Request(), nil)
	if err != nil {
		c.handlers.Done()
		return nil // the upgrader has answered already
	}
	ic := &ingestConn{
		worker:       id,
		ws:           ws,
		writeTimeout: c.cfg.WriteTimeout,
		done:         make(chan struct{}),
	}
	c.mu.Lock()
	stopping := c.stopping
	if !stopping {
		c.streams[ic] = struct{}{}
	}
	c.mu.Unlock()
	if stopping {
		ic.closeWith(int(pb.CloseCode_CLOSE_CODE_SHUTDOWN), "log collector shutting down")
		c.handlers.Done()
		return nil
	}
	// The stream gets a goroutine of its own and the handler returns: net/http's state
	// for the request (its 4 KiB read and write buffers, the request, Echo's context)
	// would otherwise stay with every idle stream, half of what one costs.
	go c.runStream(ic)
	return nil
}

// runStream serves a registered stream until it ends, then unregisters it.
func (c *Collector) runStream(ic *ingestConn) {
	defer c.handlers.Done()
	defer func() {
		c.mu.Lock()
		delete(c.streams, ic)
		c.mu.Unlock()
	}()
	defer func() { // Echo's Recover no longer covers this goroutine
		if r := recover(); r != nil {
			c.log.Error().Str("worker_id", ic.worker).Interface("panic", r).Bytes("stack", debug.Stack()).Msg("log stream handler panicked")
			ic.closeWith(websocket.CloseInternalServerErr, "internal error")
		}
	}()
	err := c.serveStream(ic)
	var se *streamError
	switch {
	case errors.As(err, &se):
		c.log.Warn().Str("worker_id", ic.worker).Err(err).Str("close_code", se.code.String()).Msg("closing log stream")
		ic.closeWith(int(se.code), se.reason)
	default:
		c.log.Info().Str("worker_id", ic.worker).Err(err).Msg("log stream ended")
		ic.closeWith(websocket.CloseNormalClosure, "")
	}
}

// serveStream runs one stream: hello, welcome, then batches until an error.
func (c *Collector) serveStream(ic *ingestConn) error {
	ws := ic.ws
	ws.SetReadLimit(maxHelloBytes) // not the batch limit: nothing bounds how many hellos are read at once
	_ = ws.SetReadDeadline(time.Now().Add(c.cfg.HelloTimeout))
	env, err := c.readFrame(ws)
	if err != nil {
		return err
	}
	ws.SetReadLimit(int64(c.cfg.MaxFrameBytes))
	hello := env.GetHello()
	switch {
	case hello == nil:
		return badFrame("first frame must be a hello, got %T", env.GetBody())
	case hello.GetProtocolVersion() != pb.LogProtocolVersion_LOG_PROTOCOL_VERSION_CURRENT:
		return &streamError{code: pb.CloseCode_CLOSE_CODE_PROTOCOL_VERSION, reason: fmt.Sprintf(
			"log protocol version %d not supported (this collector speaks %d)",
			int32(hello.GetProtocolVersion()), int32(pb.LogProtocolVersion_LOG_PROTOCOL_VERSION_CURRENT))}
	case hello.GetWorkerId() != ic.worker:
		return badFrame("hello worker_id %q does not match Worker-Id header %q", hello.GetWorkerId(), ic.worker)
	case hello.GetStreamId() == "":
		return badFrame("hello stream_id is required")
	case len(hello.GetStreamId()) > maxStreamIDBytes:
		// It is rewritten into state.json with every batch and logged.
		return badFrame("hello stream_id of %d bytes exceeds %d", len(hello.GetStreamId()), maxStreamIDBytes)
	case len(hello.GetAgent()) > maxAgentBytes:
		return badFrame("hello agent of %d bytes exceeds %d", len(hello.GetAgent()), maxAgentBytes)
	}
	w, err := c.store.worker(ic.worker)
	if err != nil {
		return &streamError{code: websocket.CloseInternalServerErr, reason: "cannot open the worker's log files"}
	}
	w.mu.Lock()
	for w.removed { // its directory was trimmed away since the lookup: start afresh
		w.mu.Unlock()
		c.store.forget(w)
		if w, err = c.store.worker(ic.worker); err != nil {
			return &streamError{code: websocket.CloseInternalServerErr, reason: "cannot open the worker's log files"}
		}
		w.mu.Lock()
	}
	// The welcome tells the agent what it may forget: only what a power cut keeps.
	if err := c.settle(w); err != nil {
		w.mu.Unlock()
		c.log.Error().Str("worker_id", ic.worker).Err(err).Msg("cannot make the worker's log state durable")
		c.met.writeErrs.Inc()
		return &streamError{code: websocket.CloseInternalServerErr, reason: "cannot make the worker's log state durable"}
	}
	// A new run of the agent starts its sequence numbers again; a stream this one
	// replaced takes up where it stood.
	w.state.switchStream(hello.GetStreamId())
	prev := w.owner
	w.owner = ic
	last := w.state.LastSeq
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		if w.owner == ic {
			w.owner, w.detachedAt = nil, c.store.now()
			// The worker may never come back (a new pod, a new id): hold no descriptor
			// for it. The next batch reopens the file.
			if w.file != nil {
				_ = w.file.Close()
				w.file = nil
			}
		}
		w.mu.Unlock()
	}()
	if prev != nil {
		prev.closeWith(int(pb.CloseCode_CLOSE_CODE_REPLACED), "a newer log stream for this worker took over")
	}
	welcome := &pb.LogEnvelope{Body: &pb.LogEnvelope_Welcome{Welcome: &pb.LogWelcome{
		ProtocolVersion: pb.LogProtocolVersion_LOG_PROTOCOL_VERSION_CURRENT,
		LastSeq:         last,
	}}}
	if err := ic.write(welcome); err != nil {
		return fmt.Errorf("send welcome: %w", err)
	}
	c.log.Info().Str("worker_id", ic.worker).Str("stream_id", hello.GetStreamId()).Str("agent", hello.GetAgent()).Uint64("last_seq", last).
		Msg("log stream connected")

	dl := &readDeadline{ws: ws, timeout: c.cfg.ReadTimeout}
	dl.extend()
	ws.SetPingHandler(func(data string) error {
		dl.extend()
		err := ws.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(c.cfg.WriteTimeout))
		if errors.Is(err, websocket.ErrCloseSent) {
			return nil
		}
		return err
	})
	ws.SetPongHandler(func(string) error { dl.extend(); return nil })

	for {
		if err := c.serveBatch(w, ic, dl); err != nil {
			return err
		}
	}
}

// readDeadline is a stream's read deadline. Between frames a stream may stay silent
// for ReadTimeout, every ping or pong giving it that long again; once a frame has
// taken a batch slot it must arrive whole within ReadTimeout, pings or not: a stream
// that started a frame and only answered pings held its slot for ever. Used by the
// stream's goroutine only (the ping and pong handlers run on it, within a read).
type readDeadline struct {
	ws      *websocket.Conn
	timeout time.Duration
	inFrame bool
}

// extend gives the stream ReadTimeout from now, unless a frame is being read.
func (d *readDeadline) extend() {
	if !d.inFrame {
		_ = d.ws.SetReadDeadline(time.Now().Add(d.timeout))
	}
}

// startFrame gives the rest of the frame ReadTimeout from now, which nothing extends.
func (d *readDeadline) startFrame() {
	d.inFrame = true
	_ = d.ws.SetReadDeadline(time.Now().Add(d.timeout))
}

// endFrame goes back to extending the deadline, from now.
func (d *readDeadline) endFrame() {
	d.inFrame = false
	d.extend()
}

// errStreamClosed ends a stream that was closed (replaced, or the collector stopping)
// while its next batch waited for a slot.
var errStreamClosed = errors.New("stream closed while its batch waited for a slot")

// serveBatch reads, writes and acknowledges the stream's next batch, holding one of
// the collector's batch slots from the moment the frame starts until it is acknowledged.
func (c *Collector) serveBatch(w *workerLog, ic *ingestConn, dl *readDeadline) error {
	kind, r, err := ic.ws.NextReader() // returns once a frame starts: nothing held yet
	if err != nil {
		return err
	}
	select {
	case c.batchSlots <- struct{}{}:
	default:
		c.met.batchWaits.Inc()
		if h := c.cfg.hooks; h != nil && h.batchWaits != nil {
			h.batchWaits <- ic.worker
		}
		select {
		case c.batchSlots <- struct{}{}:
			// A slot freed and the stream closed, both while it waited: select picks
			// either, and a closed stream writes nothing more.
			select {
			case <-ic.done:
				<-c.batchSlots
				return errStreamClosed
			default:
			}
		case <-ic.done:
			return errStreamClosed
		}
	}
	defer func() { <-c.batchSlots }()
	if h := c.cfg.hooks; h != nil && h.slotTaken != nil {
		h.slotTaken <- ic.worker
	}
	// The slot is held while the frame arrives: an agent trickling one in holds it up
	// to ReadTimeout from now (a wait for the slot was the collector's, not the
	// agent's), and pings do not extend that. Reading first would bound nothing, the
	// frame being the memory.
	dl.startFrame()
	data, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	dl.endFrame()
	env, err := c.decodeMessage(kind, data)
	if err != nil {
		return err
	}
	b := env.GetBatch()
	if b == nil {
		return badFrame("expected a batch, got %T", env.GetBody())
	}
	ack, err := c.writeBatch(w, ic, b, len(data))
	if err != nil {
		return err
	}
	if err := ic.write(&pb.LogEnvelope{Body: &pb.LogEnvelope_Ack{Ack: &pb.LogAck{Seq: ack}}}); err != nil {
		return fmt.Errorf("send ack %d: %w", ack, err)
	}
	return nil
}

// ping sends a WebSocket ping (Collector.pingStreams). A ping that cannot be written
// ends the stream: the reader sees the closed socket.
func (ic *ingestConn) ping() {
	select {
	case <-ic.done:
		return
	default:
	}
	if err := ic.ws.WriteControl(websocket.PingMessage, nil, time.Now().Add(ic.writeTimeout)); err != nil {
		_ = ic.ws.Close()
	}
}

// pingStreams pings every stream each PingInterval until ctx ends: one ticker for
// all of them, not a goroutine per stream (see frame.Pinger).
func (c *Collector) pingStreams(ctx context.Context) {
	var streams []*ingestConn
	frame.PingEvery(ctx, c.cfg.PingInterval, func(ctx context.Context, p *frame.Pinger) bool {
		c.mu.Lock()
		for ic := range c.streams {
			streams = append(streams, ic)
		}
		c.mu.Unlock()
		defer func() { clear(streams); streams = streams[:0] }()
		for _, ic := range streams {
			if !p.Go(ctx, &ic.pinging, ic.ping) {
				return false
			}
		}
		return true
	})
}

func (c *Collector) readFrame(ws *websocket.Conn) (*pb.LogEnvelope, error) {
	kind, data, err := ws.ReadMessage()
	if err != nil {
		return nil, err
	}
	return c.decodeMessage(kind, data)
}

func (c *Collector) decodeMessage(kind int, data []byte) (*pb.LogEnvelope, error) {
	if kind != websocket.BinaryMessage {
		return nil, badFrame("websocket message type %d, want binary", kind)
	}
	env, err := decodeLogFrame(data, c.cfg.MaxFrameBytes)
	if err != nil {
		return nil, badFrame("%v", err)
	}
	return env, nil
}

// writeBatch writes b, which came in a frame of frameBytes, unless it was written
// before, and returns the seq to acknowledge.
func (c *Collector) writeBatch(w *workerLog, ic *ingestConn, b *pb.LogBatch, frameBytes int) (uint64, error) {
	seq := b.GetSeq()
	if seq == 0 {
		return 0, badFrame("batch seq must be at least 1")
	}
	rotated := false
	defer func() { // after the worker's lock is let go: trimming takes every worker's
		if rotated {
			c.trimToBudget()
		}
	}()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.owner != ic {
		return 0, &streamError{code: pb.CloseCode_CLOSE_CODE_REPLACED, reason: "a newer log stream for this worker took over"}
	}
	last := w.state.LastSeq
	if seq <= last {
		// Written before; acknowledged only once that write is durable (a failed
		// directory fsync after state.json's rename may have left it unvouched for).
		if err := c.settle(w); err != nil {
			c.log.Error().Str("worker_id", ic.worker).Err(err).Uint64("seq", seq).Msg("cannot make a log batch durable")
			c.met.writeErrs.Inc()
			return 0, &streamError{code: websocket.CloseInternalServerErr, reason: "cannot write the batch"}
		}
		if e := c.log.Debug(); e.Enabled() {
			e.Str("worker_id", ic.worker).Uint64("seq", seq).Uint64("last_seq", last).Msg("duplicate batch acknowledged, not written")
		}
		c.met.duplicates.Inc()
		return seq, nil
	}
	lines := newBatchLines(ic.worker, b, last, w.state.Dropped)
	if limit := int64(batchGrowth)*int64(frameBytes) + batchSlack; lines.Size() > limit {
		// Short: a close reason holds 123 bytes.
		return 0, badFrame("batch lines of %d bytes exceed %d (%dx its %d-byte frame + 64 KiB): too many non-JSON records",
			lines.Size(), limit, batchGrowth, frameBytes)
	}
	file := w.state.File
	v, err := w.appendBatch(lines, seq, b.GetDropped(), len(b.GetRecords()), c.cfg.MaxFileBytes, c.cfg.MaxFiles)
	rotated = w.state.File != file // trimToBudget does nothing without MaxTotalBytes
	c.count(v)
	if err != nil {
		c.log.Error().Str("worker_id", ic.worker).Err(err).Uint64("seq", seq).Msg("cannot write a log batch")
		c.met.writeErrs.Inc()
		return 0, &streamError{code: websocket.CloseInternalServerErr, reason: "cannot write the batch"}
	}
	if h := c.cfg.hooks; h != nil && h.afterWrite != nil {
		if err := h.afterWrite(ic.worker, seq); err != nil {
			return 0, err
		}
	}
	return seq, nil
}

// settle is w.settle counting the batches it vouches for. The caller holds w.mu.
func (c *Collector) settle(w *workerLog) error {
	v, err := w.settle()
	c.count(v)
	return err
}

// count adds batches whose state became durable to the written ones: each batch is
// counted once, when it is vouched for (appendBatch, or a later settle when its
// directory fsync failed), whether or not its ack then reaches the agent.
func (c *Collector) count(v vouched) {
	if v.batches > 0 {
		c.met.batches.Add(float64(v.batches))
		c.met.records.Add(float64(v.records))
	}
}

// collectorNote is a record the collector adds to a worker's file: records the agent
// dropped, or batches that never arrived.
type collectorNote struct {
	Level        string `json:"level"`
	Time         string `json:"time"`
	WorkerID     string `json:"worker_id"`
	Component    string `json:"component"`
	Event        string `json:"event"`
	Dropped      uint64 `json:"dropped,omitempty"`
	DroppedTotal uint64 `json:"dropped_total,omitempty"`
	MissingFrom  uint64 `json:"missing_from,omitempty"`
	MissingTo    uint64 `json:"missing_to,omitempty"`
	Message      string `json:"message"`
}

// batchLines is a batch as the lines it is written as: one JSON object per line,
// preceded by notes when the agent reports new drops or sequence numbers are missing.
// Its size is worked out first (newBatchLines), so that a batch is refused, or the
// file rotated, before a byte of it is written; WriteTo then streams the lines out
// rather than building them in memory.
type batchLines struct {
	worker  string
	notes   [][]byte
	records [][]byte
	kinds   []lineKind // what each record becomes
	size    int64
	scratch []byte // a wrapped or cleaned record, reused
}

// lineKind is how a record is written.
type lineKind uint8

const (
	lineAsSent  lineKind = iota // a JSON object on one line in valid UTF-8: as sent, trimmed
	lineCleaned                 // a JSON object with invalid UTF-8 or line breaks: cleanRecord
	lineWrapped                 // anything else: wrapped as an invalid_log_record
)

func newBatchLines(worker string, b *pb.LogBatch, last, dropped uint64) *batchLines {
	bl := &batchLines{worker: worker, records: b.GetRecords(), kinds: make([]lineKind, len(b.GetRecords()))}
	now := time.Now().UTC().Format(time.RFC3339Nano)
	note := func(n collectorNote) {
		n.Level, n.Time, n.WorkerID, n.Component = "warn", now, worker, "log_collector"
		line, _ := json.Marshal(n)
		line = append(line, '\n')
		bl.notes = append(bl.notes, line)
		bl.size += int64(len(line))
	}
	if b.GetSeq() > last+1 {
		note(collectorNote{Event: "log_batches_missing", MissingFrom: last + 1, MissingTo: b.GetSeq() - 1,
			Message: "log batches of this stream are not in the collector's files: removed with the worker's files (--max-total-bytes, or by hand) or lost after they were acknowledged"})
	}
	if b.GetDropped() > dropped {
		note(collectorNote{Event: "log_records_dropped", Dropped: b.GetDropped() - dropped, DroppedTotal: b.GetDropped(),
			Message: "the agent dropped log records because its buffer was full"})
	}
	for i, r := range bl.records {
		t := bytes.TrimSpace(r)
		switch {
		case len(t) == 0 || t[0] != '{' || !json.Valid(t):
			bl.kinds[i] = lineWrapped
			bl.scratch = appendWrapped(bl.scratch[:0], worker, r)
			bl.size += int64(len(bl.scratch))
		case !utf8.Valid(t) || bytes.ContainsAny(t, "\r\n"):
			bl.kinds[i] = lineCleaned
			bl.size += int64(len(cleanRecord(t))) + 1
		default:
			bl.size += int64(len(t)) + 1
		}
	}
	return bl
}

// Size is the bytes WriteTo writes.
func (bl *batchLines) Size() int64 { return bl.size }

// WriteTo writes the lines to w (a bufio.Writer: records go out one by one).
func (bl *batchLines) WriteTo(w io.Writer) (int64, error) {
	var n int64
	write := func(b []byte) error {
		m, err := w.Write(b)
		n += int64(m)
		return err
	}
	for _, line := range bl.notes {
		if err := write(line); err != nil {
			return n, err
		}
	}
	for i, r := range bl.records {
		var line []byte
		switch bl.kinds[i] {
		case lineAsSent:
			if err := write(bytes.TrimSpace(r)); err != nil {
				return n, err
			}
			line = newline
		case lineCleaned:
			line = append(cleanRecord(bytes.TrimSpace(r)), '\n')
		case lineWrapped:
			bl.scratch = appendWrapped(bl.scratch[:0], bl.worker, r)
			line = bl.scratch
		}
		if err := write(line); err != nil {
			return n, err
		}
	}
	return n, nil
}

var newline = []byte{'\n'}

// cleanRecord makes a JSON object one line of valid UTF-8. json.Valid lets invalid
// UTF-8 through inside strings; stored as is, the file and GET /logs would not be
// JSON to strict readers. Outside strings such bytes fail json.Valid, so replacing
// them keeps the object valid and its fields (event, level) readable.
func cleanRecord(t []byte) []byte {
	if !utf8.Valid(t) {
		t = bytes.ToValidUTF8(t, []byte("\uFFFD"))
	}
	if bytes.ContainsAny(t, "\r\n") {
		var buf bytes.Buffer
		if json.Compact(&buf, t) == nil {
			t = buf.Bytes()
		}
	}
	return t
}

// appendWrapped appends r, a record that is not a JSON object, as the line
// {"worker_id":…,"event":"invalid_log_record","raw":…}, so that every line stays one.
func appendWrapped(out []byte, worker string, r []byte) []byte {
	out = append(out, `{"worker_id":`...)
	out = appendJSONString(out, []byte(worker))
	out = append(out, `,"event":"invalid_log_record","raw":`...)
	out = appendJSONString(out, r)
	return append(out, "}\n"...)
}

// appendJSONString appends s as a JSON string; invalid UTF-8 becomes U+FFFD, as
// encoding/json writes it.
func appendJSONString(out, s []byte) []byte {
	const hex = "0123456789abcdef"
	out = append(out, '"')
	for len(s) > 0 {
		c := s[0]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				out = append(out, '\\', c)
			case c == '\n':
				out = append(out, '\\', 'n')
			case c == '\r':
				out = append(out, '\\', 'r')
			case c == '\t':
				out = append(out, '\\', 't')
			case c < 0x20:
				out = append(out, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			default:
				out = append(out, c)
			}
			s = s[1:]
			continue
		}
		r, size := utf8.DecodeRune(s)
		if r == utf8.RuneError && size == 1 {
			out = append(out, `\ufffd`...)
		} else {
			out = append(out, s[:size]...)
		}
		s = s[size:]
	}
	return append(out, '"')
}
