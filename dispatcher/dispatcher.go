// Package dispatcher is smartroute's dispatcher: the HTTP task API, the ops API, the
// /worker-listen WebSocket and the hub that feeds the scheduler. cmd/dispatcher turns
// flags into a Config and calls Run.
package dispatcher

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"

	"github.com/smartroute/smartroute/proto/frame"
	pb "github.com/smartroute/smartroute/proto/smartroutev1"
)

// Dispatcher serves producers and workers.
type Dispatcher struct {
	cfg  Config
	log  zerolog.Logger
	id   string
	hub  *hub
	echo *echo.Echo
	auth *authenticator
	tls  *tls.Config // nil: plain HTTP
	// uploader forwards /upload-model; nil when no uploader is configured.
	uploader *http.Client
}

// parseError marks a body that was read but is not a valid task.
type parseError struct{ err error }

func (e *parseError) Error() string { return e.err.Error() }

type errorBody struct {
	Error string `json:"error"`
}

// ErrConfig marks New's errors that come from the Config itself (a bad value, an
// unreadable token file or certificate), as against the journal or the network.
var ErrConfig = errors.New("dispatcher config")

// New validates the config and builds a Dispatcher; Run or Handler serve it.
func New(cfg Config) (*Dispatcher, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	auth, err := newAuthenticator(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	tlsCfg, err := serverTLS(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	h, err := newHub(cfg)
	if err != nil {
		return nil, err
	}
	if cfg.DataDir != "" {
		if err := h.openJournal(); err != nil {
			return nil, err
		}
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	host, _ := os.Hostname()
	d := &Dispatcher{
		cfg:  cfg,
		log:  cfg.Logger.With().Str("component", "dispatcher").Logger(),
		id:   host + "-" + hex.EncodeToString(b[:]),
		hub:  h,
		auth: auth,
		tls:  tlsCfg,
	}
	if cfg.UploaderURL != "" {
		d.uploader = &http.Client{
			Timeout: 30 * time.Minute, // model conversion is slow
			// A redirect is the uploader's answer, not an address to re-POST the
			// producer's request to: it is a 502 like any other non-2xx answer.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	d.echo = d.routes()
	return d, nil
}

// Close releases the journal; Run does it on its way out. Idempotent.
func (d *Dispatcher) Close() error {
	if d.hub.journal == nil {
		return nil
	}
	return d.hub.journal.close()
}

// Handler is the dispatcher's HTTP handler, for tests and embedding. Deadlines and
// worker pings run only while Run or RunBackground is running.
func (d *Dispatcher) Handler() http.Handler { return d.echo }

// Registry is the registry GET /metrics serves; a program embedding the dispatcher
// may register collectors of its own on it.
func (d *Dispatcher) Registry() *prometheus.Registry { return d.hub.met.reg }

func (d *Dispatcher) routes() *echo.Echo {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.Use(d.recoverPanic)
	e.Use(d.authorize)
	e.HTTPErrorHandler = func(err error, c echo.Context) {
		if c.Response().Committed {
			return
		}
		status, msg := http.StatusInternalServerError, "internal error"
		var he *echo.HTTPError
		if errors.As(err, &he) {
			status, msg = he.Code, fmt.Sprint(he.Message)
		}
		if status >= 500 && !errors.Is(err, errHandlerPanicked) {
			d.log.Error().Err(err).Str("path", c.Path()).Msg("request failed")
		}
		_ = c.JSON(status, errorBody{msg})
	}
	e.POST("/run-task", d.runTask)
	e.GET("/tasks/:id", d.getTask)
	e.GET("/health", func(c echo.Context) error { return c.JSON(http.StatusOK, map[string]string{"message": "OK"}) })
	e.GET("/workers", d.getWorkers)
	e.POST("/workers/:id/drain", d.drainWorker)
	e.GET("/labels", func(c echo.Context) error { return c.JSON(http.StatusOK, d.hub.labelHolders()) })
	e.POST("/upload-model", d.uploadModel)
	e.GET("/worker-listen", d.serveWorker)
	e.GET("/metrics", echo.WrapHandler(promhttp.HandlerFor(d.hub.met.reg, promhttp.HandlerOpts{})))
	return e
}

// recoverPanic answers a handler's panic with a 500 (through the error handler) and
// logs it with the panicking goroutine's stack. Echo's Recover would log through
// Echo's own logger, outside the dispatcher's zerolog stream, and dump every
// goroutine's stack into one 4 KiB line; its deferred closure also cost an allocation
// per request. http.ErrAbortHandler goes on up: it is how a handler asks net/http to
// drop the connection without an answer.
func (d *Dispatcher) recoverPanic(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) (err error) {
		defer func() {
			if r := recover(); r != nil {
				if r == http.ErrAbortHandler { //nolint:errorlint // the sentinel itself is panicked
					panic(r)
				}
				d.log.Error().Str("panic", fmt.Sprint(r)).Str("path", c.Path()).
					Bytes("stack", debug.Stack()).Msg("handler panicked")
				err = &echo.HTTPError{Code: http.StatusInternalServerError, Message: "internal error", Internal: errHandlerPanicked}
			}
		}()
		return next(c)
	}
}

// errHandlerPanicked marks recoverPanic's 500, logged already with its stack.
var errHandlerPanicked = errors.New("handler panicked")

// readBody reads a request's body, at most limit bytes, into buf.
func readBody(c echo.Context, buf *bytes.Buffer, limit int64) error {
	_, err := buf.ReadFrom(http.MaxBytesReader(c.Response(), c.Request().Body, limit))
	return err
}

// bodyReadError answers a body that could not be read: too large (413), not in
// within BodyReadTimeout (408), or cut off (400).
func (d *Dispatcher) bodyReadError(c echo.Context, err error, what string) error {
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return c.JSON(http.StatusRequestEntityTooLarge, errorBody{fmt.Sprintf("%s larger than %d bytes", what, d.cfg.MaxBodyBytes)})
	case errors.Is(err, os.ErrDeadlineExceeded):
		c.Response().Header().Set(echo.HeaderConnection, "close")
		return c.JSON(http.StatusRequestTimeout, errorBody{fmt.Sprintf("%s not received within %v (--body-read-timeout)", what, d.cfg.BodyReadTimeout)})
	}
	return c.JSON(http.StatusBadRequest, errorBody{"reading body: " + err.Error()})
}

// bodyBuffers recycles request-body buffers: io.ReadAll grows a fresh slice for every
// task. parseRunTask copies what it keeps, so a buffer goes back once parsed.
var bodyBuffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

func (d *Dispatcher) runTask(c echo.Context) error {
	buf := bodyBuffers.Get().(*bytes.Buffer)
	buf.Reset()
	err := readBody(c, buf, d.cfg.MaxBodyBytes)
	var spec taskSpec
	if err == nil {
		spec, err = parseRunTask(buf.Bytes())
		if err != nil {
			err = &parseError{err}
		}
	}
	if buf.Cap() <= 64<<10 { // a rare huge body is not kept
		bodyBuffers.Put(buf)
	}
	if err != nil {
		var perr *parseError // not above: errors.As moves it to the heap
		if errors.As(err, &perr) {
			return c.JSON(http.StatusBadRequest, errorBody{perr.err.Error()})
		}
		return d.bodyReadError(c, err, "body")
	}
	if err := d.checkParams(spec); err != nil {
		return c.JSON(err.status, errorBody{err.msg})
	}
	rec, fresh, err := d.hub.submit(spec)
	if err != nil {
		var se *submitError
		if errors.As(err, &se) {
			switch se.status {
			case http.StatusTooManyRequests:
				c.Response().Header().Set("Retry-After", "1")
			case http.StatusServiceUnavailable: // shutting down, or the journal's disk failing
				c.Response().Header().Set("Retry-After", strconv.Itoa(int(unavailableRetryAfter/time.Second)))
			}
			return c.JSON(se.status, errorBody{se.msg})
		}
		return err
	}
	if !spec.returnResult {
		if d.cfg.onAsyncAdmitted != nil {
			d.cfg.onAsyncAdmitted(rec.sched.ID)
		}
		// Refused as it was routed (no connected worker can load its label, or the
		// label is failing): the producer gets the refusal, as a synchronous one does,
		// not a 202 for a task that will never run. Not a task that ran and failed
		// since: that is for GET /tasks/{id}.
		if fresh && rec.refusedAtAdmit {
			return d.writeAnswer(c, rec)
		}
		v := d.hub.viewOf(rec)
		return c.JSON(http.StatusAccepted, map[string]string{"task_id": v.TaskID, "status": v.Status})
	}
	select { // answered already (a resubmitted id): no timer needed
	case <-rec.done:
		return d.writeAnswer(c, rec)
	default:
	}
	// Wait for the answer. A producer that goes away leaves the task running; its
	// result stays available from GET /tasks/{id}. Every task is answered by its
	// deadline, or overrunGrace after it when its worker overran it without a word (the
	// hub's tick answers it then).
	if d.cfg.onWait != nil {
		d.cfg.onWait(rec.sched.ID)
	}
	select {
	case <-rec.done:
		return d.writeAnswer(c, rec)
	case <-c.Request().Context().Done():
		return nil
	}
}

func (d *Dispatcher) getTask(c echo.Context) error {
	raw, err := pathParam(c, "id")
	if err != nil {
		return c.JSON(http.StatusBadRequest, errorBody{err.Error()})
	}
	id, err := parseTaskID(raw)
	if err != nil {
		return c.JSON(http.StatusBadRequest, errorBody{err.Error()})
	}
	v, ok := d.hub.lookup(id)
	if !ok {
		return c.JSON(http.StatusNotFound, errorBody{"unknown task " + id})
	}
	return writeView(c, http.StatusOK, v)
}

// pathParam is a path parameter unescaped. Echo routes on the raw path when the
// request's escaping is not Go's default (a %2F, or a client that escapes ':' or '='),
// and then hands the parameter over still escaped.
func pathParam(c echo.Context, name string) (string, error) {
	v := c.Param(name)
	if c.Request().URL.RawPath == "" {
		return v, nil
	}
	u, err := url.PathUnescape(v)
	if err != nil {
		return "", fmt.Errorf("%s: %w", name, err)
	}
	return u, nil
}

func (d *Dispatcher) getWorkers(c echo.Context) error {
	detail, err := parseWorkersQuery(c.Request().URL.RawQuery)
	if err != nil {
		return c.JSON(http.StatusBadRequest, errorBody{err.Error()})
	}
	if detail {
		return c.JSON(http.StatusOK, map[string]any{"workers": d.hub.workerDetails()})
	}
	return c.JSON(http.StatusOK, map[string][]string{"workers": d.hub.workerIDs()})
}

// drainWorker asks a connected worker to finish its tasks and take no new ones; the
// agent then closes its connection (and, as a pod, exits to be replaced).
func (d *Dispatcher) drainWorker(c echo.Context) error {
	id, err := pathParam(c, "id")
	if err != nil {
		return c.JSON(http.StatusBadRequest, errorBody{err.Error()})
	}
	reason, err := parseDrainQuery(c.Request().URL.RawQuery)
	if err != nil {
		return c.JSON(http.StatusBadRequest, errorBody{err.Error()})
	}
	if reason == "" {
		reason = "drain requested through the dispatcher's API"
	}
	if !d.hub.drain(id, reason) {
		return c.JSON(http.StatusNotFound, errorBody{fmt.Sprintf("worker %q is not connected", id)})
	}
	d.log.Info().Str("worker_id", id).Str("reason", reason).Msg("worker asked to drain")
	return c.JSON(http.StatusAccepted, map[string]any{"worker_id": id, "draining": true})
}

func (d *Dispatcher) uploadModel(c echo.Context) error {
	if d.uploader == nil {
		return c.JSON(http.StatusServiceUnavailable, errorBody{errNoUploader.Error()})
	}
	var body bytes.Buffer
	if err := readBody(c, &body, d.cfg.MaxBodyBytes); err != nil {
		return d.bodyReadError(c, err, "upload request")
	}
	req, err := http.NewRequestWithContext(c.Request().Context(), http.MethodPost, d.cfg.UploaderURL+"/upload-model", &body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := d.uploader.Do(req)
	if err != nil {
		return c.JSON(http.StatusBadGateway, errorBody{"uploader unreachable: " + err.Error()})
	}
	defer resp.Body.Close()
	const maxUploaderAnswer = 1 << 20
	out, err := io.ReadAll(io.LimitReader(resp.Body, maxUploaderAnswer+1))
	if err != nil {
		return c.JSON(http.StatusBadGateway, errorBody{"reading uploader answer: " + err.Error()})
	}
	if len(out) > maxUploaderAnswer { // passed on cut, it would be a broken answer
		return c.JSON(http.StatusBadGateway, errorBody{fmt.Sprintf("uploader answer larger than %d bytes", maxUploaderAnswer)})
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		// Not passed on: an HTML error page is no JSON answer, and an uploader's 401 or
		// 404 would read as the dispatcher refusing the key or lacking the route.
		msg := "uploader answered " + resp.Status
		if loc := resp.Header.Get("Location"); resp.StatusCode >= 300 && resp.StatusCode < 400 && loc != "" {
			msg += " (redirect to " + excerpt([]byte(loc)) + ", not followed)"
		}
		if e := excerpt(out); e != "" {
			msg += ": " + e
		}
		return c.JSON(http.StatusBadGateway, errorBody{msg})
	}
	ct := resp.Header.Get("Content-Type")
	if ct == "" {
		ct = echo.MIMEApplicationJSON
	}
	return c.Blob(resp.StatusCode, ct, out)
}

// excerptBytes bounds what excerpt keeps of an uploader's error answer.
const excerptBytes = 200

// excerpt is the start of b as one line of valid UTF-8: control characters and runs of
// spaces become one space, and past excerptBytes it is cut with "...".
func excerpt(b []byte) string {
	cut := len(b) > excerptBytes
	if cut {
		b = b[:excerptBytes]
	}
	s := strings.ToValidUTF8(string(b), "") // a rune cut in two at the end goes too
	s = strings.Join(strings.FieldsFunc(s, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }), " ")
	if cut {
		s += "..."
	}
	return s
}

// RunBackground does the dispatcher's periodic work until ctx ends: it fails queued
// tasks whose deadline passed and running ones whose worker overran it without
// answering, rebalances waiting tasks, and pings every worker. Run starts it; a
// program that serves Handler itself must start it too.
func (d *Dispatcher) RunBackground(ctx context.Context) {
	// Deadlines are checked on a short tick rather than with a timer per task: the
	// heaps make a check cheap, and 20ms is well inside any useful deadline.
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	// Pings go on beside, not in this loop: a ping can wait out a stuck socket's
	// write, and deadlines must not wait for it.
	pingsDone := make(chan struct{})
	go func() { d.pingWorkers(ctx); close(pingsDone) }()
	defer func() { <-pingsDone }()
	// The journal's janitor too: a sweep that catches up on many expired answers
	// writes for a while, and deadlines must not wait for it either.
	if d.hub.journal != nil {
		janitorDone := make(chan struct{})
		go func() { d.sweepJournal(ctx); close(janitorDone) }()
		defer func() { <-janitorDone }()
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			d.hub.tick()
		}
	}
}

// sweepJournal deletes expired answers from the journal every JournalSweepInterval
// until ctx ends.
func (d *Dispatcher) sweepJournal(ctx context.Context) {
	t := time.NewTicker(d.cfg.JournalSweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			d.hub.sweepJournal()
		}
	}
}

// pingWorkers pings every connected worker each PingInterval until ctx ends (see
// frame.Pinger for why each ping has a goroutine of its own).
func (d *Dispatcher) pingWorkers(ctx context.Context) {
	frame.PingEvery(ctx, d.cfg.PingInterval, d.pingRound)
}

// pingRound starts a ping to every worker not still waiting on its last one. It
// reports false when ctx ended first.
func (d *Dispatcher) pingRound(ctx context.Context, p *frame.Pinger) bool {
	for _, wc := range d.hub.connections() {
		if !p.Go(ctx, &wc.pinging, wc.ping) {
			return false
		}
	}
	return true
}

// Run serves on cfg.Addr until ctx ends, then shuts down gracefully: it stops
// accepting, lets in-flight tasks finish within ShutdownTimeout (failing the rest with
// 503), and closes workers with CLOSE_CODE_SHUTDOWN so they reconnect elsewhere or
// later. ready, if not nil, receives the bound address once listening.
func (d *Dispatcher) Run(ctx context.Context, ready chan<- net.Addr) error {
	ln, err := net.Listen("tcp", d.cfg.Addr)
	if err != nil {
		d.Close()
		return fmt.Errorf("listen on %s: %w", d.cfg.Addr, err)
	}
	if d.tls != nil {
		ln = tls.NewListener(ln, d.tls)
	}
	// ReadTimeout bounds reading a request, its body included: a body that stalls is
	// answered 408 (bodyReadError) or its connection closed. It does not cut what
	// follows: net/http lifts the deadline once the body is read (its background read
	// for a closed connection), and the /worker-listen upgrade (gorilla) clears it
	// before the socket sets its own. TestBodyReadTimeoutSparesAnswerWaitsAndWorkers
	// holds both to that.
	srv := &http.Server{Handler: d.echo, ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout: d.cfg.BodyReadTimeout, IdleTimeout: d.cfg.IdleTimeout}
	expiryCtx, stopExpiry := context.WithCancel(context.Background())
	defer stopExpiry()
	go d.RunBackground(expiryCtx)

	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	d.logAuthMode()
	d.log.Info().Str("addr", ln.Addr().String()).Str("policy", string(d.cfg.Scheduler.Policy)).Bool("tls", d.tls != nil).Msg("dispatcher listening")
	if ready != nil {
		ready <- ln.Addr()
	}
	select {
	case err := <-serveErr:
		d.Close()
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	return d.shutdown(srv)
}

func (d *Dispatcher) shutdown(srv *http.Server) error {
	d.log.Info().Dur("timeout", d.cfg.ShutdownTimeout).Msg("shutting down: finishing in-flight tasks")
	deadline, cancel := context.WithTimeout(context.Background(), d.cfg.ShutdownTimeout)
	defer cancel()
	// Handlers get a little longer than tasks, to write the 503s of tasks failed when
	// the task deadline runs out.
	httpDeadline, cancelHTTP := context.WithTimeout(context.Background(), d.cfg.ShutdownTimeout+2*time.Second)
	defer cancelHTTP()
	idle := d.hub.beginShutdown()
	httpDone := make(chan error, 1)
	// Shutdown closes the listener at once and waits for handlers, including
	// producers waiting on their tasks; workers keep running those tasks meanwhile.
	go func() { httpDone <- srv.Shutdown(httpDeadline) }()
	select {
	case <-idle:
	case <-deadline.Done():
		failed, kept := d.hub.failAll("dispatcher shut down before the task finished")
		if failed > 0 {
			d.log.Warn().Int("tasks", failed).Msg("shutdown timeout: unfinished tasks failed with 503")
		}
		if kept > 0 {
			d.log.Info().Int("tasks", kept).Msg("shutdown timeout: unfinished asynchronous tasks stay in the journal for the next start")
		}
		// Let the Cancel frames of those tasks' attempts out before the close frames.
		flushBy := time.After(time.Second)
		for _, wc := range d.hub.connections() {
			select {
			case <-wc.flushed():
			case <-flushBy:
			}
		}
	}
	conns := d.hub.closeWorkers(&Disconnect{Code: pb.CloseCode_CLOSE_CODE_SHUTDOWN, Reason: "dispatcher shutting down"})
	closeBy := time.After(time.Second) // one bound for all close frames
	for _, wc := range conns {
		select {
		case <-wc.done():
		case <-closeBy:
		}
	}
	err := <-httpDone
	if errors.Is(err, context.DeadlineExceeded) {
		err = srv.Close()
	}
	// The workers are gone: no released task changes any more.
	d.hub.markReleased()
	if cerr := d.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("close journal: %w", cerr)
	}
	d.log.Info().Int("workers_closed", len(conns)).Msg("dispatcher stopped")
	return err
}
