// Package logcollector is smartroute's log collector: worker agents stream their
// structured log records to its /ingest WebSocket (proto/smartroute/v1/logs.proto); it
// writes them as JSON lines per worker with size-based rotation, acknowledges each
// batch once it is durably written, drops batches it has already written (by sequence
// number, remembered across restarts), and answers GET /logs queries.
// cmd/log-collector turns flags into a Config and calls Run.
package logcollector

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"

	"github.com/smartroute/smartroute/proto/certfile"
	"github.com/smartroute/smartroute/proto/credential"
	pb "github.com/smartroute/smartroute/proto/smartroutev1"
)

// Defaults filled in by WithDefaults.
const (
	DefaultAddr              = "127.0.0.1:8090"
	DefaultDir               = "./logs"
	DefaultMaxFileBytes      = 64 << 20
	DefaultMaxFiles          = 10
	DefaultMaxFrameBytes     = 16 << 20
	DefaultMaxActiveBatches  = 16
	DefaultMaxActiveQueries  = 2
	DefaultQueryWriteTimeout = time.Minute
	DefaultHelloTimeout      = 10 * time.Second
	DefaultWriteTimeout      = 10 * time.Second
	DefaultReadTimeout       = 60 * time.Second
	DefaultPingInterval      = 20 * time.Second
	DefaultShutdownTimeout   = 10 * time.Second
)

// Config configures New. Each field's comment says what its zero value means.
type Config struct {
	// Addr is where Run listens. Empty means 127.0.0.1:8090.
	Addr string
	// Dir holds a directory per worker. Empty means ./logs.
	Dir string
	// MaxFileBytes: a worker's current file is rotated before a batch would take it
	// past this size (a single larger batch gets a file of its own). Zero means 64 MiB.
	MaxFileBytes int64
	// MaxFiles is how many files a worker keeps, the current one included; the oldest
	// is deleted at rotation. Zero means 10.
	MaxFiles int
	// MaxTotalBytes bounds the files of all workers together: past it the oldest
	// files are deleted, whichever worker's they are; a current file only once its
	// worker is gone (store.trimToBudget). Zero means no bound beyond MaxFiles per worker.
	MaxTotalBytes int64
	// MaxFrameBytes is the read limit of an ingest frame. Zero means 16 MiB.
	MaxFrameBytes int
	// MaxActiveBatches bounds the batches being read, decoded and written at once,
	// across all streams. Each holds about twice its size in memory (the frame and
	// its records decoded; the lines are streamed to the file); a stream whose next
	// batch finds no slot free waits, and its agent's later batches wait in its own
	// buffer. Zero means 16.
	MaxActiveBatches int
	// MaxActiveQueries bounds the GET /logs queries run at once. Each holds up to
	// MaxQueryBytes (64 MiB) of records from its scan until its answer is written; a
	// query beyond the bound is answered 503 with Retry-After. Zero means 2.
	MaxActiveQueries int
	// QueryWriteTimeout bounds the writing of a GET /logs answer, from the end of its
	// scan: a client that stops reading is cut off then, and its query's records
	// freed. Zero means 1m.
	QueryWriteTimeout time.Duration
	// HelloTimeout bounds the wait for an agent's hello. Zero means 10s.
	HelloTimeout time.Duration
	// WriteTimeout is the deadline of every frame written to an agent. Zero means 10s.
	WriteTimeout time.Duration
	// ReadTimeout is how long a stream may stay silent (no frame, ping or pong) before
	// it is dropped, and how long a frame may take to arrive once it has a batch slot
	// (pings do not extend that). Zero means 60s.
	ReadTimeout time.Duration
	// PingInterval is how often the collector pings each agent. Zero means 20s; it must
	// be below ReadTimeout.
	PingInterval time.Duration
	// ShutdownTimeout bounds the wait for queries and batches in progress when Run
	// stops. Zero means 10s.
	ShutdownTimeout time.Duration
	// IngestTokens are the bearer tokens accepted on /ingest (give it the agents'
	// worker tokens). Empty means agents stream without credentials.
	IngestTokens []string
	// TLSCert and TLSKey are PEM files; with both set, Run serves HTTPS and wss://.
	// Empty means plain HTTP.
	TLSCert string
	TLSKey  string
	// Logger receives the collector's own log. The zero value discards it.
	Logger zerolog.Logger

	hooks *testHooks // set only by this package's tests
}

// testHooks let tests stop the collector at moments they cannot reach from outside.
type testHooks struct {
	// afterWrite runs once a batch is durably written, before it is acknowledged; an
	// error drops the connection without the ack, as a crash there would.
	afterWrite func(worker string, seq uint64) error
	// queryBytes, when above 0, replaces MaxQueryBytes.
	queryBytes int
	// batchWaits, when set, receives the worker id of each stream whose next batch
	// has to wait for a slot (MaxActiveBatches), as it starts waiting.
	batchWaits chan<- string
	// slotTaken, when set, receives the worker id of each stream whose next batch
	// has taken a slot, before its frame is read.
	slotTaken chan<- string
	// now, when set, is the store's clock (how long workers have been gone).
	now func() time.Time
	// queryHeld, when set, runs in each GET /logs that has taken a query slot, before
	// its scan.
	queryHeld func()
	// queryWritten, when set, receives the outcome of writing each GET /logs answer
	// (nil once written whole), after its write deadline is lifted.
	queryWritten chan<- error
}

// WithDefaults returns a copy of c with zero values replaced by their defaults.
func (c Config) WithDefaults() Config {
	if c.Addr == "" {
		c.Addr = DefaultAddr
	}
	if c.Dir == "" {
		c.Dir = DefaultDir
	}
	if c.MaxFileBytes == 0 {
		c.MaxFileBytes = DefaultMaxFileBytes
	}
	if c.MaxFiles == 0 {
		c.MaxFiles = DefaultMaxFiles
	}
	if c.MaxFrameBytes == 0 {
		c.MaxFrameBytes = DefaultMaxFrameBytes
	}
	if c.MaxActiveBatches == 0 {
		c.MaxActiveBatches = DefaultMaxActiveBatches
	}
	if c.MaxActiveQueries == 0 {
		c.MaxActiveQueries = DefaultMaxActiveQueries
	}
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{
		{&c.HelloTimeout, DefaultHelloTimeout}, {&c.WriteTimeout, DefaultWriteTimeout},
		{&c.ReadTimeout, DefaultReadTimeout}, {&c.PingInterval, DefaultPingInterval},
		{&c.ShutdownTimeout, DefaultShutdownTimeout}, {&c.QueryWriteTimeout, DefaultQueryWriteTimeout},
	} {
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	return c
}

// validate checks a config that went through WithDefaults; each message names the field.
func (c Config) validate() error {
	var errs []error
	if c.MaxFileBytes < 1 {
		errs = append(errs, fmt.Errorf("MaxFileBytes (--max-file-bytes) must be at least 1, got %d", c.MaxFileBytes))
	}
	if c.MaxTotalBytes < 0 {
		errs = append(errs, fmt.Errorf("MaxTotalBytes (--max-total-bytes) must not be negative, got %d", c.MaxTotalBytes))
	}
	if c.MaxFiles < 1 {
		errs = append(errs, fmt.Errorf("MaxFiles (--max-files) must be at least 1, got %d", c.MaxFiles))
	}
	if c.MaxFrameBytes < 1024 {
		errs = append(errs, fmt.Errorf("MaxFrameBytes must be at least 1024, got %d", c.MaxFrameBytes))
	}
	if c.MaxActiveBatches < 1 {
		errs = append(errs, fmt.Errorf("MaxActiveBatches (--max-active-batches) must be at least 1, got %d", c.MaxActiveBatches))
	}
	if c.MaxActiveQueries < 1 {
		errs = append(errs, fmt.Errorf("MaxActiveQueries (--max-active-queries) must be at least 1, got %d", c.MaxActiveQueries))
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{
		{"HelloTimeout", c.HelloTimeout}, {"WriteTimeout", c.WriteTimeout}, {"ReadTimeout", c.ReadTimeout},
		{"PingInterval", c.PingInterval}, {"ShutdownTimeout", c.ShutdownTimeout},
		{"QueryWriteTimeout (--query-write-timeout)", c.QueryWriteTimeout},
	} {
		if f.d < 0 {
			errs = append(errs, fmt.Errorf("%s must not be negative, got %s", f.name, f.d))
		}
	}
	if c.PingInterval >= c.ReadTimeout {
		errs = append(errs, fmt.Errorf("PingInterval (%s) must be below ReadTimeout (%s)", c.PingInterval, c.ReadTimeout))
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		errs = append(errs, fmt.Errorf("TLSCert and TLSKey (--tls-cert, --tls-key) must be set together (got %q, %q)", c.TLSCert, c.TLSKey))
	}
	return errors.Join(errs...)
}

// Collector receives log streams and serves queries over them.
type Collector struct {
	cfg   Config
	log   zerolog.Logger
	store *store
	echo  *echo.Echo
	// ingestTokens are the accepted /ingest tokens; nil when none are needed.
	ingestTokens credential.Set
	tls          *tls.Config // nil: plain HTTP
	met          *metrics

	// mu guards streams and stopping. streams holds the live ingest connections; each
	// handler adds and removes its own, shutdown closes them all.
	mu       sync.Mutex
	streams  map[*ingestConn]struct{}
	stopping bool
	handlers sync.WaitGroup // ingest handlers past the upgrade

	// batchSlots holds a token for each batch being read, decoded and written
	// (MaxActiveBatches): after a collector restart every agent resends its backlog at
	// once, and without a bound their frames in hand together outgrow the memory limit.
	batchSlots chan struct{}
	// querySlots holds a token for each GET /logs query from its scan until its
	// answer is written (MaxActiveQueries): each may hold MaxQueryBytes.
	querySlots chan struct{}
}

type errorBody struct {
	Error string `json:"error"`
}

// ErrConfig marks New's errors that come from the Config itself (a bad value, an
// unreadable certificate), as against the log directory or the network.
var ErrConfig = errors.New("log collector config")

// New validates the config, creates Dir and builds a Collector; Run or Handler serve it.
func New(cfg Config) (*Collector, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	tokens, err := credential.Load("IngestTokens", cfg.IngestTokens, "", "")
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	var tlsCfg *tls.Config
	if cfg.TLSCert != "" {
		// A renewed pair in the same files is served without a restart.
		pair, err := certfile.Load(cfg.TLSCert, cfg.TLSKey)
		if err != nil {
			return nil, fmt.Errorf("%w: TLSCert/TLSKey: %w", ErrConfig, err)
		}
		log := cfg.Logger.With().Str("component", "tls").Logger()
		pair.OnReload = func(err error) {
			if err != nil {
				log.Error().Err(err).Msg("renewed TLS certificate not taken")
				return
			}
			log.Info().Str("cert_file", cfg.TLSCert).Msg("renewed TLS certificate taken")
		}
		// HTTP/1.1 only: /ingest is a WebSocket upgrade, which HTTP/2 cannot hijack.
		tlsCfg = &tls.Config{GetCertificate: pair.GetCertificate, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}}
	}
	st, err := newStore(cfg.Dir, cfg.MaxFileBytes, cfg.MaxFiles)
	if err != nil {
		return nil, err
	}
	st.maxTotalBytes = cfg.MaxTotalBytes
	if cfg.hooks != nil && cfg.hooks.now != nil {
		st.now = cfg.hooks.now
	}
	c := &Collector{
		cfg:          cfg,
		log:          cfg.Logger.With().Str("component", "log_collector").Logger(),
		store:        st,
		streams:      map[*ingestConn]struct{}{},
		batchSlots:   make(chan struct{}, cfg.MaxActiveBatches),
		querySlots:   make(chan struct{}, cfg.MaxActiveQueries),
		ingestTokens: tokens,
		tls:          tlsCfg,
	}
	c.met = newMetrics(c)
	c.echo = c.routes()
	c.trimToBudget() // a lower --max-total-bytes, or files left from before it was set
	return c, nil
}

// Handler is the collector's HTTP handler, for tests and embedding; call Close when
// done. Only Run pings the streams; served this way, they live on the agents' pings.
func (c *Collector) Handler() http.Handler { return c.echo }

// errHandlerPanicked marks the 500 of a recovered panic, logged already with its stack.
var errHandlerPanicked = errors.New("handler panicked")

func (c *Collector) routes() *echo.Echo {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	// A handler's panic is logged through the collector's zerolog stream, with the
	// panicking goroutine's stack only, rather than through Echo's own logger.
	e.Use(middleware.RecoverWithConfig(middleware.RecoverConfig{
		DisableStackAll: true,
		LogErrorFunc: func(ctx echo.Context, err error, stack []byte) error {
			c.log.Error().Err(err).Str("path", ctx.Path()).Bytes("stack", stack).Msg("handler panicked")
			return &echo.HTTPError{Code: http.StatusInternalServerError, Message: "internal error", Internal: errHandlerPanicked}
		},
	}))
	e.HTTPErrorHandler = func(err error, ctx echo.Context) {
		if ctx.Response().Committed {
			return
		}
		status, msg := http.StatusInternalServerError, "internal error"
		var he *echo.HTTPError
		if errors.As(err, &he) {
			status, msg = he.Code, fmt.Sprint(he.Message)
		}
		if status >= 500 && !errors.Is(err, errHandlerPanicked) {
			c.log.Error().Err(err).Str("path", ctx.Path()).Msg("request failed")
		}
		_ = ctx.JSON(status, errorBody{msg})
	}
	e.GET("/health", func(ctx echo.Context) error {
		return ctx.JSON(http.StatusOK, map[string]string{"message": "OK"})
	})
	e.GET("/logs", c.getLogs)
	e.GET("/ingest", c.ingest)
	e.GET("/metrics", echo.WrapHandler(promhttp.HandlerFor(c.met.reg, promhttp.HandlerOpts{})))
	return e
}

// getLogs answers GET /logs?worker=&level=&event=&since=&until=&limit=. What it holds
// is bounded three ways: the records of one query by MaxQueryBytes (the answer is
// streamed, not built), the queries at once by MaxActiveQueries, and how long a
// client may take to read an answer by QueryWriteTimeout.
func (c *Collector) getLogs(ctx echo.Context) error {
	q, err := parseLogQuery(ctx.Request().URL.RawQuery, time.Now())
	if err != nil {
		return ctx.JSON(http.StatusBadRequest, errorBody{err.Error()})
	}
	if h := c.cfg.hooks; h != nil && h.queryBytes > 0 {
		q.maxBytes = h.queryBytes
	}
	select {
	case c.querySlots <- struct{}{}:
	default:
		c.met.queriesRefused.Inc()
		ctx.Response().Header().Set("Retry-After", "1")
		return ctx.JSON(http.StatusServiceUnavailable, errorBody{fmt.Sprintf(
			"%d queries are running, the most at once (--max-active-queries); retry shortly", c.cfg.MaxActiveQueries)})
	}
	held := true
	release := func() {
		if held {
			held = false
			<-c.querySlots
		}
	}
	defer release()
	if h := c.cfg.hooks; h != nil && h.queryHeld != nil {
		h.queryHeld()
	}
	res, err := c.store.query(ctx.Request().Context(), q)
	if errors.Is(err, errUnknownWorker) {
		return ctx.JSON(http.StatusNotFound, errorBody{err.Error()})
	}
	if err != nil && ctx.Request().Context().Err() != nil {
		return nil // the caller is gone; nobody reads an answer
	}
	if err != nil {
		return err
	}
	for _, err := range res.unreadable {
		c.log.Warn().Err(err).Msg("left a worker's unreadable logs out of a query over every worker")
	}
	err = c.writeLogsBy(ctx, res, time.Now().Add(c.cfg.QueryWriteTimeout))
	// Freed before the hook says the answer is written, so that a test's next query
	// finds the slot (it raced the deferred release and got 503).
	release()
	if h := c.cfg.hooks; h != nil && h.queryWritten != nil {
		h.queryWritten <- err
	}
	if err != nil {
		c.log.Debug().Err(err).Int("records", len(res.records)).Msg("a query's answer was not written whole")
	}
	return nil // the status is sent; the connection is closed on a write error
}

// writeLogsBy writes res as GET /logs's answer, which must be written by deadline.
// The handler's deadline, not the server's WriteTimeout: that one would be set on
// /ingest's connections too, which are hijacked and keep it unless gorilla's Upgrade
// clears it (v1.5.3 does). It is lifted afterwards: with no WriteTimeout, net/http does
// not reset it for the next request on a kept-alive connection.
func (c *Collector) writeLogsBy(ctx echo.Context, res queryResult, deadline time.Time) error {
	rc := http.NewResponseController(ctx.Response())
	if err := rc.SetWriteDeadline(deadline); err != nil {
		return fmt.Errorf("set the write deadline: %w", err)
	}
	defer func() { _ = rc.SetWriteDeadline(time.Time{}) }()
	ctx.Response().Header().Set(echo.HeaderContentType, echo.MIMEApplicationJSON)
	ctx.Response().WriteHeader(http.StatusOK)
	return writeLogs(ctx.Response(), res)
}

// Run serves on cfg.Addr until ctx ends, then shuts down: the listener closes, every
// stream is closed with CLOSE_CODE_SHUTDOWN (agents resend what was not acknowledged
// to the next collector), batches being written finish, and the files are closed, all
// within ShutdownTimeout. ready, if not nil, receives the bound address once listening.
func (c *Collector) Run(ctx context.Context, ready chan<- net.Addr) error {
	ln, err := net.Listen("tcp", c.cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", c.cfg.Addr, err)
	}
	if c.tls != nil {
		ln = tls.NewListener(ln, c.tls)
	}
	srv := &http.Server{Handler: c.echo, ReadHeaderTimeout: 10 * time.Second}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	pingCtx, stopPings := context.WithCancel(context.Background())
	pingsDone := make(chan struct{})
	go func() { c.pingStreams(pingCtx); close(pingsDone) }()
	defer func() { stopPings(); <-pingsDone }() // after the streams closed: no ping waits
	c.log.Info().Str("addr", ln.Addr().String()).Str("dir", c.cfg.Dir).Int64("max_file_bytes", c.cfg.MaxFileBytes).
		Int("max_files", c.cfg.MaxFiles).Bool("tls", c.tls != nil).Bool("ingest_auth", c.ingestTokens != nil).Msg("log collector listening")
	if ready != nil {
		ready <- ln.Addr()
	}
	select {
	case err := <-serveErr:
		_ = c.Close()
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	c.log.Info().Msg("log collector shutting down")
	deadline, cancel := context.WithTimeout(context.Background(), c.cfg.ShutdownTimeout)
	defer cancel()
	httpDone := make(chan error, 1)
	go func() { httpDone <- srv.Shutdown(deadline) }() // stops accepting; waits for queries
	closeErr := c.shutdown(deadline)
	err = <-httpDone
	if errors.Is(err, context.DeadlineExceeded) {
		err = srv.Close()
	}
	c.log.Info().Msg("log collector stopped")
	return errors.Join(err, closeErr)
}

// Close closes every stream with CLOSE_CODE_SHUTDOWN, waits up to ShutdownTimeout for
// their handlers, and closes the files. New streams are refused from then on.
// Idempotent. Run calls it; so should whoever serves Handler.
func (c *Collector) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.ShutdownTimeout)
	defer cancel()
	return c.shutdown(ctx)
}

func (c *Collector) shutdown(ctx context.Context) error {
	c.mu.Lock()
	c.stopping = true
	streams := make([]*ingestConn, 0, len(c.streams))
	for s := range c.streams {
		streams = append(streams, s)
	}
	c.mu.Unlock()
	// All at once, and each close frame given no longer than the shutdown has: one
	// after another, agents that stopped reading cost a write timeout each.
	var closing sync.WaitGroup
	for _, s := range streams {
		deadline := time.Now().Add(s.writeTimeout)
		if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
			deadline = d
		}
		closing.Go(func() { s.closeBy(int(pb.CloseCode_CLOSE_CODE_SHUTDOWN), "log collector shutting down", deadline) })
	}
	closing.Wait()
	done := make(chan struct{})
	go func() { c.handlers.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("ingest handlers still running after %s", c.cfg.ShutdownTimeout)
	}
	return c.store.close()
}

// trimToBudget keeps all workers' files within MaxTotalBytes (see store.trimToBudget).
// Called at start and after each rotation, the only times the files grow by a file.
func (c *Collector) trimToBudget() {
	n, gone, err := c.store.trimToBudget()
	if n > 0 {
		c.met.budgetDeletes.Add(float64(n))
		c.log.Info().Int("deleted_files", n).Strs("removed_workers", gone).Int64("max_total_bytes", c.cfg.MaxTotalBytes).
			Msg("deleted the oldest log files to stay within the total bound")
	}
	if err != nil {
		c.log.Error().Err(err).Msg("cannot keep the log files within --max-total-bytes")
	}
}
