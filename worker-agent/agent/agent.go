// Package agent is the smartroute worker agent: it dials the dispatcher's worker
// WebSocket, says hello, runs the task assignments it receives on a backend, keeps the
// backend's labels within capacity, and reports results and label events back. It
// reconnects on its own, gives up on close codes that say retrying is pointless, and
// drains on shutdown.
package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/gorilla/websocket"
	"github.com/rs/zerolog"

	"github.com/smartroute/smartroute/proto/credential"
	"github.com/smartroute/smartroute/proto/frame"
	pb "github.com/smartroute/smartroute/proto/smartroutev1"
	"github.com/smartroute/smartroute/worker-agent/backend"
	"github.com/smartroute/smartroute/worker-agent/backend/sim"
	"github.com/smartroute/smartroute/worker-agent/backend/triton"
	"github.com/smartroute/smartroute/worker-agent/internal/wsdial"
	"github.com/smartroute/smartroute/worker-agent/logship"
)

// Version is reported in the hello's agent string. Set it at build time with
// -ldflags "-X github.com/smartroute/smartroute/worker-agent/agent.Version=v1.2.3".
var Version = "dev"

// cancelGrace bounds the wait for tasks to stop once they have been cancelled.
const cancelGrace = 5 * time.Second

// errShutdown cancels work the agent abandons (drain timeout, lost connection, giving
// up). Tasks cancelled with it send no result: the dispatcher re-queues them itself.
var errShutdown = errors.New("worker shutting down")

// Run connects to the dispatcher and serves task assignments until ctx is cancelled or
// the dispatcher sends Drain; then it drains (stops taking tasks, waits up to
// DrainTimeout for those in flight, sends their results, closes the connection
// normally) and returns nil. It returns an error when the config is invalid, the
// backend cannot be set up, or the dispatcher ends the connection with a close code
// that means giving up (see CloseError and DialError).
func Run(ctx context.Context, cfg Config) error {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	a, err := newAgent(cfg)
	if err != nil {
		return err
	}
	return a.run(ctx)
}

// agent is one Run. Lock order: mu may be taken while labels.mu is held, never the
// other way round. Statuses and Inventory frames are queued with mu held, so that they
// leave in the order of the changes they report (session.send never blocks and takes
// neither lock).
type agent struct {
	cfg         Config
	base        zerolog.Logger // with worker_id, for child loggers
	log         zerolog.Logger // component=agent
	taskLog     zerolog.Logger // component=task
	backend     backend.Backend
	dialer      *websocket.Dialer
	agentString string
	logShip     *logship.Shipper // nil unless LogCollectorURL is set; closed when run returns
	metrics     *Metrics         // cfg.Metrics; nil means none

	// Set up by start, read-only afterwards.
	labels *labelManager

	// workCtx carries tasks, loads and the pollers; it outlives ctx so that a
	// drain can let tasks finish, and is cancelled with errShutdown when Run ends.
	workCtx  context.Context
	stopWork context.CancelCauseFunc
	bg       sync.WaitGroup // the health and inventory pollers
	// inventoryFailing: the last inventory check failed. Only the inventory poller
	// touches it.
	inventoryFailing bool

	// cur is the live session, where label events and statuses go. It is stored with
	// labels.mu and mu held (so a hello and the events after it are ordered), and
	// cleared when the session ends.
	cur      atomic.Pointer[session]
	sessions uint64 // sessions dialled; only the Run goroutine touches it

	// drainCh is closed, once, by the beginDrain call that set draining.
	drainCh chan struct{}

	mu                sync.Mutex
	draining          bool
	available         bool   // the backend's last Health answer, and it has models
	unavailableReason string // why not, when !available
	// noModels is set while a backend with a repository (Triton) lists none of this
	// worker's labels: it is then unavailable, since an empty list would tell the
	// dispatcher "any label". Cleared by refreshLoadable once models appear.
	noModels bool
	// loadable is what the hello announces (empty: any label); set by start, and by
	// refreshLoadable when the backend's repository changes.
	loadable []string
	tasks    map[taskKey]*runningTask
	// idle is made by a waitIdle that finds tasks running, and closed and cleared when
	// tasks empties: no channel per busy spell when nobody waits.
	idle chan struct{}

	// idleRunners are the runner goroutines waiting for an attempt (startTask), at
	// most Slots, each on a channel of its own; runnersStopped is set, and their
	// channels closed, when work stops. Guarded by runMu.
	runMu          sync.Mutex
	idleRunners    []chan taskJob
	runnersStopped bool

	// deadlineTimer runs expireTasks at deadlineAt, the earliest deadline of an attempt
	// when it was armed (zero: not armed). Guarded by mu.
	deadlineTimer deadlineTimer
	deadlineAt    time.Time
	// clock is a test's stand-in for the wall clock in deadlines; nil: the wall clock.
	clock deadlineClock
}

func newAgent(cfg Config) (_ *agent, err error) {
	lvl, err := zerolog.ParseLevel(cfg.LogLevel)
	if err != nil {
		return nil, err
	}
	tlsCfg, err := clientTLS(cfg.CAFile)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	logOut, ship := cfg.LogOutput, (*logship.Shipper)(nil)
	if cfg.LogCollectorURL != "" { // tee every record into the shipper; it never blocks
		own := zerolog.New(cfg.LogOutput).Level(lvl).With().Timestamp().Str("worker_id", cfg.WorkerID).Logger()
		ship, err = logship.New(logship.Config{URL: cfg.LogCollectorURL, WorkerID: cfg.WorkerID, Agent: "worker-agent " + Version,
			Token: cfg.WorkerToken, TLS: tlsCfg, Logger: own})
		if err != nil {
			return nil, fmt.Errorf("%w: LogCollectorURL: %w", ErrConfig, err)
		}
		logOut = zerolog.MultiLevelWriter(cfg.LogOutput, ship)
		defer func() {
			if err != nil {
				_ = ship.Close()
			}
		}()
	}
	base := zerolog.New(logOut).Level(lvl).With().Timestamp().Str("worker_id", cfg.WorkerID).Logger()
	b := cfg.Backend
	if b == nil {
		switch cfg.BackendName {
		case sim.Name:
			if b, err = sim.New(cfg.Sim); err != nil {
				return nil, fmt.Errorf("backend %s: %w", cfg.BackendName, err)
			}
		case triton.Name:
			tc := cfg.Triton
			tc.Log = base.With().Str("component", "triton").Logger()
			if tc.MaxAnswerSize == 0 {
				// Room for any answer whose result can fit in a frame.
				tc.MaxAnswerSize = max(triton.DefaultMaxAnswerSize, 2*int64(cfg.MaxFrameSize))
			}
			if tc.MaxIdleConns == 0 {
				// A connection for each task run at once, and a few for the health
				// check, index reads and unloads beside them: fewer, and every burst
				// of tasks dials anew.
				tc.MaxIdleConns = cfg.Slots + 4
			}
			if cfg.Metrics != nil {
				tc.OnError = cfg.Metrics.tritonError
				cfg.Metrics.tritonOps(triton.Ops())
			}
			if b, err = triton.New(tc); err != nil {
				return nil, fmt.Errorf("backend %s: %w", cfg.BackendName, err)
			}
		default:
			return nil, fmt.Errorf("unknown backend %q", cfg.BackendName)
		}
	}
	workCtx, stopWork := context.WithCancelCause(context.Background())
	return &agent{
		cfg:         cfg,
		base:        base,
		log:         base.With().Str("component", "agent").Logger(),
		taskLog:     base.With().Str("component", "task").Logger(),
		backend:     b,
		dialer:      &websocket.Dialer{HandshakeTimeout: cfg.HandshakeTimeout, Proxy: http.ProxyFromEnvironment, NetDialContext: dialBatching, TLSClientConfig: tlsCfg},
		agentString: fmt.Sprintf("worker-agent %s backend=%s", Version, b.Name()),
		logShip:     ship,
		metrics:     cfg.Metrics,
		workCtx:     workCtx,
		stopWork:    stopWork,
		drainCh:     make(chan struct{}),
		tasks:       make(map[taskKey]*runningTask),
		available:   true, // until Health says otherwise
		clock:       cfg.hooks.deadlineClock(),
	}, nil
}

func (a *agent) run(ctx context.Context) error {
	defer a.metrics.track(a)() // deferred first, so it runs after the shipper's Close
	if a.logShip != nil {      // runs last: flushes the records up to "worker agent stopped"
		defer func() {
			if err := a.logShip.Close(); err != nil {
				a.log.Warn().Err(err).Msg("log shipping stopped with records undelivered")
			}
		}()
	}
	defer a.stopBackground()
	a.log.Info().Str("dispatcher_url", a.cfg.DispatcherURL).Int("max_labels", a.cfg.MaxLabels).
		Int("slots", a.cfg.Slots).Str("agent", a.agentString).Msg("worker agent starting")
	if err := a.start(ctx); err != nil {
		if ctx.Err() != nil { // stopped while waiting for the backend to start
			a.log.Info().Err(err).Msg("worker agent stopped before it started")
			return nil
		}
		return err
	}
	err := a.serve(ctx)
	if err != nil {
		a.log.Error().Err(err).Msg("worker agent giving up")
		return err
	}
	a.log.Info().Msg("worker agent stopped")
	return nil
}

// start learns the backend's labels and health and starts the pollers.
func (a *agent) start(ctx context.Context) error {
	if s, ok := a.backend.(backend.Starter); ok {
		// Triton may still be starting: wait for it (bounded by the backend's own
		// start timeout) so that the inventory below is true.
		if err := s.WaitStarted(ctx); err != nil {
			return fmt.Errorf("backend %s: %w", a.backend.Name(), err)
		}
	}
	inv, err := a.startInventory(ctx)
	if err != nil {
		return err
	}
	a.loadable = intersectLabels(a.cfg.Labels, inv.Loadable)
	_, repository := a.backend.(backend.Repository)
	switch {
	case repository && (len(inv.Loadable) == 0 || len(a.loadable) == 0):
		// Models may be uploaded later (a fresh cluster): wait for them unavailable, not
		// offering every label (the empty list's meaning on the wire), each of whose
		// loads would fail and mark the label failing on the whole fleet.
		a.loadable = nil
		a.noModels = true
		a.log.Warn().Strs("labels", a.cfg.Labels).Strs("repository", inv.Loadable).
			Msg("backend's repository lists none of this worker's labels; unavailable until it does")
	case len(a.loadable) == 0 && (len(a.cfg.Labels) > 0 || len(inv.Loadable) > 0):
		return fmt.Errorf("none of Labels %q can be loaded by backend %s (it can load %q)", a.cfg.Labels, a.backend.Name(), inv.Loadable)
	}
	emit := func(ev *pb.LabelEvent) {
		a.cur.Load().send(&pb.Envelope{Body: &pb.Envelope_LabelEvent{LabelEvent: ev}})
	}
	labelLog := a.base.With().Str("component", "labels").Logger()
	a.labels = newLabelManager(a.workCtx, a.backend, a.cfg.MaxLabels, a.loadable, labelLog, emit)
	if h := a.cfg.hooks; h != nil {
		a.labels.onJoin, a.labels.onWait = h.labelJoin, h.labelWait
	}
	a.labels.metrics = a.metrics
	a.metrics.labelsSeen(a.loadable)
	if err := a.labels.adopt(ctx, inv.Loaded); err != nil {
		return fmt.Errorf("backend %s: %w", a.backend.Name(), err)
	}
	a.checkHealth()
	a.bg.Add(1)
	go a.every(a.cfg.HealthInterval, a.checkHealth)
	if repo, ok := a.backend.(backend.Repository); ok {
		a.bg.Add(1)
		go a.every(a.cfg.InventoryInterval, func() { a.checkInventory(repo) })
	}
	return nil
}

// checkInventory asks the backend which labels it can load, so that a model added to
// the repository becomes routable without a restart.
// startInventory reads what the backend holds and can load. A backend with a repository
// (Triton) is asked again, with a backoff, until it answers: without its list the
// worker would offer every label, and without what it holds it could load past
// MaxLabels. Other backends' failures are taken as nothing loaded.
func (a *agent) startInventory(ctx context.Context) (backend.Inventory, error) {
	_, repository := a.backend.(backend.Repository)
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval, bo.MaxInterval = 500*time.Millisecond, 30*time.Second
	for attempt := 1; ; attempt++ {
		ictx, cancel := context.WithTimeout(ctx, a.cfg.HandshakeTimeout)
		inv, err := a.backend.Inventory(ictx)
		cancel()
		if err == nil {
			return inv, nil
		}
		if !repository {
			// A backend that is not up yet reports later through Health.
			a.log.Warn().Err(err).Msg("backend inventory failed; assuming no label is loaded")
			return backend.Inventory{}, nil
		}
		ev := a.log.Debug()
		if attempt == 1 {
			ev = a.log.Warn()
		}
		ev.Err(err).Int("attempt", attempt).Msg("backend inventory failed; asking again before connecting")
		t := time.NewTimer(bo.NextBackOff())
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return backend.Inventory{}, fmt.Errorf("backend %s inventory: %w", a.backend.Name(), err)
		}
	}
}

func (a *agent) checkInventory(repo backend.Repository) {
	// Bounded like a handshake, not by the interval: a short interval must not fail
	// every check of a slow index.
	ctx, cancel := context.WithTimeout(a.workCtx, a.cfg.HandshakeTimeout)
	labels, err := repo.Loadable(ctx)
	cancel()
	if err != nil {
		// The health check reports a backend that is down; a failure while it is up
		// is news once, not at every check.
		ev := a.log.Debug()
		if !a.inventoryFailing {
			ev = a.log.Warn()
		}
		a.inventoryFailing = true
		ev.Err(err).Msg("backend inventory check failed; new models wait for the next one")
		return
	}
	a.inventoryFailing = false
	a.refreshLoadable(labels)
}

// refreshLoadable takes the backend's current loadable labels: new loads follow them,
// and the dispatcher hears of a change when it takes Inventory frames (else at the
// next hello). Labels held stay held.
func (a *agent) refreshLoadable(backendLabels []string) {
	// Empty means any label on the wire: a repository that lists none of the labels
	// (emptied, or mid-deploy) must not make this worker claim every label, nor, with
	// --labels, every configured one (intersectLabels would return them all).
	if len(backendLabels) == 0 {
		return
	}
	loadable := intersectLabels(a.cfg.Labels, backendLabels)
	if len(loadable) == 0 {
		return
	}
	a.mu.Lock()
	old := a.loadable
	a.mu.Unlock()
	if sameLabels(old, loadable) { // only this poller writes a.loadable
		return
	}
	// Under both locks (labels.mu first, the allowed order), and queued before either
	// is let go: a result that found the new list in an acquire leaves after the
	// Inventory (the dispatcher requeues a task refused for a label removed, and must
	// by then know this worker cannot take it), and a catch-up Inventory in connect
	// cannot overtake a newer one.
	tell, hadNone := false, false
	a.labels.setLoadable(loadable, func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		a.loadable = loadable
		hadNone, a.noModels = a.noModels, false
		if s := a.cur.Load(); s != nil && s.inventoryUpdates {
			tell = true
			s.send(inventoryFrame(loadable))
		}
	})
	a.metrics.labelsSeen(loadable)
	a.log.Info().Strs("added", missingFrom(old, loadable)).Strs("removed", missingFrom(loadable, old)).
		Bool("dispatcher_told", tell).Msg("backend's loadable labels changed")
	if hadNone {
		a.checkHealth() // available now, if the backend is up; after the Inventory
	}
}

func inventoryFrame(loadable []string) *pb.Envelope {
	return &pb.Envelope{Body: &pb.Envelope_Inventory{Inventory: &pb.Inventory{LoadableLabels: loadable}}}
}

// sameLabels reports whether a and b hold the same labels, in any order.
func sameLabels(a, b []string) bool {
	return len(a) == len(b) && len(missingFrom(a, b)) == 0
}

// missingFrom lists the labels of b that a lacks.
func missingFrom(a, b []string) []string {
	var out []string
	for _, l := range b {
		if !slices.Contains(a, l) {
			out = append(out, l)
		}
	}
	return out
}

// intersectLabels combines the configured labels with the backend's; empty means any.
func intersectLabels(configured, backendLabels []string) []string {
	if len(configured) == 0 {
		return backendLabels
	}
	if len(backendLabels) == 0 {
		return configured
	}
	can := make(map[string]bool, len(backendLabels))
	for _, l := range backendLabels {
		can[l] = true
	}
	var out []string
	for _, l := range configured {
		if can[l] {
			out = append(out, l)
		}
	}
	return out
}

// stopBackground cancels the remaining work and waits for loads and the poller.
func (a *agent) stopBackground() {
	a.stopWork(errShutdown)
	a.stopRunners()
	a.stopTasks()
	if a.labels != nil {
		a.labels.wait()
	}
	a.bg.Wait()
}

// serve keeps a session up until shutdown or a reason to give up.
func (a *agent) serve(ctx context.Context) error {
	bo := &backoff.ExponentialBackOff{
		InitialInterval:     a.cfg.ReconnectMin,
		RandomizationFactor: 0.5,
		Multiplier:          2,
		MaxInterval:         a.cfg.ReconnectMax,
	}
	bo.Reset()
	for {
		if ctx.Err() != nil || a.isDraining() {
			a.finishOffline()
			return nil
		}
		s, err := a.connect(ctx)
		var lived time.Duration
		if err == nil {
			connected := time.Now()
			select {
			case <-s.done:
				s.wg.Wait()
				a.cur.CompareAndSwap(s, nil)
				err, lived = s.err, time.Since(connected)
				abandoned := a.abandon(s)
				a.log.Info().Err(err).Uint64("conn", s.id).Float64("lived_ms", millis(lived)).
					Int("abandoned", abandoned).Msg("disconnected")
			case <-ctx.Done():
				a.drain(s, "shutdown signal")
				return nil
			case <-a.drainCh:
				a.drain(s, "")
				return nil
			}
		}
		if ctx.Err() != nil || a.isDraining() {
			continue
		}
		switch reconnectPolicy(err) {
		case giveUp:
			a.finishOffline()
			return fmt.Errorf("worker %s stops: %w", a.cfg.WorkerID, err)
		case reconnectNow:
			if lived >= a.cfg.BackoffResetAfter {
				a.log.Info().Err(err).Msg("reconnecting at once")
				continue
			}
			// Cut off again soon after connecting: back off like any failure, or the
			// worker and the dispatcher trade hellos in a tight loop.
		}
		if lived >= a.cfg.BackoffResetAfter {
			bo.Reset()
		}
		wait := bo.NextBackOff()
		if authRefused(err) {
			a.log.Error().Err(err).Bool("token_set", a.cfg.WorkerToken != "").Float64("retry_in_ms", millis(wait)).
				Msg("the dispatcher refused this worker's token (--worker-token / WORKER_TOKEN); retrying after backoff")
		} else {
			a.log.Info().Err(err).Float64("retry_in_ms", millis(wait)).Msg("reconnecting after backoff")
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
		case <-a.drainCh:
		}
		t.Stop()
	}
}

// connect dials, says hello and waits for the Welcome. On success the session's
// reader and writer are running.
func (a *agent) connect(ctx context.Context) (*session, error) {
	header := http.Header{"Worker-Id": []string{a.cfg.WorkerID}}
	if a.cfg.WorkerToken != "" {
		header.Set("Authorization", credential.Header(a.cfg.WorkerToken))
	}
	// Shutdown closes the connection from the moment it exists until the handshake is
	// over (the upgrade would otherwise wait out HandshakeTimeout); the session watches
	// it after that.
	d, unwatch := wsdial.Watched(a.dialer, ctx)
	conn, resp, err := d.DialContext(ctx, a.cfg.DispatcherURL, header)
	unwatch()
	if err != nil {
		return nil, dialError(resp, err)
	}
	a.sessions++
	s := newSession(a.sessions, conn, &a.cfg, a.log)
	// Shutdown during the handshake closes the connection, which ends any read or write.
	stop := context.AfterFunc(ctx, func() { s.end(ctx.Err()) })
	defer stop()
	fail := func(err error) (*session, error) {
		a.cur.CompareAndSwap(s, nil)
		s.end(err)
		return nil, err
	}

	var hello *pb.Envelope
	a.labels.snapshot(func(held []string) {
		a.mu.Lock()
		defer a.mu.Unlock()
		hello = &pb.Envelope{Body: &pb.Envelope_Hello{Hello: &pb.Hello{
			ProtocolVersion: frame.ProtocolVersion,
			WorkerId:        a.cfg.WorkerID,
			MaxLabels:       uint32(a.cfg.MaxLabels),
			Slots:           uint32(a.cfg.Slots),
			HeldLabels:      held,
			LoadableLabels:  a.loadable,
			Agent:           a.agentString,
			Unavailable:     !a.available,
		}}}
		// From here on label events and statuses queue on s, behind the hello.
		a.cur.Store(s)
	})
	if err := s.setWriteDeadline(); err != nil {
		return fail(fmt.Errorf("send hello: %w", err))
	}
	if _, err := s.write(hello, nil); err != nil {
		return fail(fmt.Errorf("send hello: %w", err))
	}
	welcome, err := a.awaitWelcome(s)
	if err != nil {
		return fail(err)
	}
	if !stop() {
		return fail(ctx.Err())
	}
	if m := welcome.GetMaxFrameBytes(); m > 0 && m < uint64(s.maxFrame) {
		s.maxFrame = int(m)
	}
	// A change to the loadable labels since the hello was built went untold (the
	// session did not yet know it could tell); it is told now, behind the hello.
	a.mu.Lock()
	s.inventoryUpdates = welcome.GetInventoryUpdates()
	if s.inventoryUpdates && !sameLabels(a.loadable, hello.GetHello().GetLoadableLabels()) {
		s.send(inventoryFrame(a.loadable)) // under a.mu: a newer list cannot go first
	}
	a.mu.Unlock()
	a.log.Info().Uint64("conn", s.id).Str("dispatcher_id", welcome.GetDispatcherId()).
		Strs("held_labels", hello.GetHello().GetHeldLabels()).Bool("unavailable", hello.GetHello().GetUnavailable()).
		Msg("connected")
	if !a.metrics.sessionStarted(s) {
		return fail(fmt.Errorf("connection ended during the handshake: %v", s.err))
	}
	s.wg.Add(2)
	go s.writeLoop()
	go a.readLoop(s)
	return s, nil
}

// awaitWelcome reads the dispatcher's answer to the hello.
func (a *agent) awaitWelcome(s *session) (*pb.Welcome, error) {
	for {
		env, err := s.readFrame(a.cfg.MaxFrameSize, a.cfg.HandshakeTimeout)
		var pe *protocolError
		switch {
		case errors.As(err, &pe):
			s.closeWith(int(pb.CloseCode_CLOSE_CODE_BAD_FRAME), pe.msg, err)
			return nil, err
		case isTimeout(err):
			return nil, fmt.Errorf("no welcome within %s: %w", a.cfg.HandshakeTimeout, err)
		case err != nil:
			return nil, err
		case env == nil:
			continue
		}
		w := env.GetWelcome()
		if w == nil {
			err := &protocolError{msg: fmt.Sprintf("expected a welcome, got %T", env.GetBody())}
			s.closeWith(int(pb.CloseCode_CLOSE_CODE_BAD_FRAME), err.msg, err)
			return nil, err
		}
		if v := w.GetProtocolVersion(); v != pb.ProtocolVersion_PROTOCOL_VERSION_UNSPECIFIED && v != frame.ProtocolVersion {
			return nil, &fatalError{fmt.Errorf("dispatcher welcomed protocol version %d, this worker speaks %d", v, frame.ProtocolVersion)}
		}
		return w, nil
	}
}

func isTimeout(err error) bool {
	var ne interface{ Timeout() bool }
	return errors.As(err, &ne) && ne.Timeout()
}

func dialError(resp *http.Response, err error) error {
	de := &DialError{Err: err}
	if resp != nil {
		de.StatusCode = resp.StatusCode
		if resp.Body != nil {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			_ = resp.Body.Close()
			de.Body = strings.TrimSpace(string(b))
		}
	}
	return de
}

// readLoop is the session's only reader. It never blocks on anything but the socket.
func (a *agent) readLoop(s *session) {
	defer s.wg.Done()
	for {
		env, err := s.readFrame(a.cfg.MaxFrameSize, a.cfg.ReadTimeout)
		if err != nil {
			var pe *protocolError // not above: errors.As moves it to the heap
			if errors.As(err, &pe) {
				s.log.Warn().Err(err).Msg("bad frame from the dispatcher, closing the connection")
				s.closeWith(int(pb.CloseCode_CLOSE_CODE_BAD_FRAME), pe.msg, err)
				return
			}
			s.end(err)
			return
		}
		if env == nil {
			continue
		}
		switch body := env.GetBody().(type) {
		case *pb.Envelope_Assignment:
			a.assign(s, body.Assignment)
		case *pb.Envelope_Cancel:
			a.cancel(s, body.Cancel)
		case *pb.Envelope_Drain:
			a.beginDrain("dispatcher asked: " + body.Drain.GetReason())
		case *pb.Envelope_Welcome:
			s.log.Debug().Msg("ignoring a second welcome")
		default:
			err := &protocolError{msg: fmt.Sprintf("unexpected %T from the dispatcher", body)}
			s.log.Warn().Err(err).Msg("bad frame from the dispatcher, closing the connection")
			s.closeWith(int(pb.CloseCode_CLOSE_CODE_BAD_FRAME), err.msg, err)
			return
		}
	}
}

func (a *agent) isDraining() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.draining
}

// beginDrain stops taking tasks and tells the dispatcher so. Idempotent.
func (a *agent) beginDrain(reason string) {
	a.mu.Lock()
	if a.draining {
		a.mu.Unlock()
		return
	}
	a.draining = true
	inFlight := len(a.tasks)
	// Queued under a.mu, as setAvailable queues its statuses: an "available" decided
	// before the drain cannot then go out after "draining" and have the dispatcher
	// route tasks to a worker that refuses them. Before waking Run, whose drain ends
	// with flushing the queue.
	a.cur.Load().send(statusFrame(false, "draining"))
	a.mu.Unlock()
	a.log.Info().Str("reason", reason).Int("in_flight", inFlight).Msg("draining: taking no new tasks")
	close(a.drainCh)
}

// drain finishes the in-flight tasks on s, flushes their results and closes s normally.
func (a *agent) drain(s *session, reason string) {
	a.beginDrain(reason)
	if !a.waitIdle(a.cfg.DrainTimeout, s.done) {
		n := a.cancelTasks(errShutdown)
		a.log.Warn().Int("cancelled", n).Bool("connection_lost", s.ended()).
			Msg("drain: cancelling the tasks still running; the dispatcher re-queues them")
		a.waitIdle(cancelGrace, nil)
	}
	s.closeNormally()
	a.cur.CompareAndSwap(s, nil)
	a.log.Info().Msg("drained")
}

// abandon cancels the attempts assigned on s, a session that has ended. The dispatcher
// re-queued them when the connection ended and drops a result of an attempt it no
// longer waits for, so running on would only take a backend slot beside the new
// session's tasks (attempt 2 of the same task, often), pin labels the new session's
// tasks must evict, and hold up a drain. Their results are discarded (errShutdown).
func (a *agent) abandon(s *session) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, rt := range a.tasks {
		if rt.s == s {
			rt.cancel(errShutdown)
			n++
		}
	}
	return n
}

// finishOffline stops the tasks of a connection that is gone: nobody can receive their
// results, so they are cancelled rather than waited for.
func (a *agent) finishOffline() {
	a.beginDrain("no connection")
	if n := a.cancelTasks(errShutdown); n > 0 {
		a.log.Info().Int("cancelled", n).Msg("cancelling tasks whose connection is gone")
	}
	a.waitIdle(cancelGrace, nil)
}

// waitIdle waits until no task runs, up to timeout or until abort closes. It reports
// whether no task runs.
func (a *agent) waitIdle(timeout time.Duration, abort <-chan struct{}) bool {
	a.mu.Lock()
	if len(a.tasks) == 0 {
		a.mu.Unlock()
		return true
	}
	if a.idle == nil {
		a.idle = make(chan struct{})
	}
	idle := a.idle
	a.mu.Unlock()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-idle:
		return true
	case <-t.C:
	case <-abort:
	}
	select {
	case <-idle:
		return true
	default:
		return false
	}
}

// every runs check each interval until the agent stops (the health and inventory
// pollers).
func (a *agent) every(interval time.Duration, check func()) {
	defer a.bg.Done()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-a.workCtx.Done():
			return
		case <-t.C:
			check()
		}
	}
}

// checkHealth records the backend's availability and reports a change to the dispatcher.
func (a *agent) checkHealth() {
	ctx, cancel := context.WithTimeout(a.workCtx, a.cfg.HealthInterval)
	err := a.backend.Health(ctx)
	cancel()
	if a.workCtx.Err() != nil {
		return
	}
	available, reason := err == nil, "backend available"
	if err != nil {
		reason = "backend unavailable: " + err.Error()
	}
	a.setAvailable(available, reason)
}

// setAvailable records whether the backend can take tasks and reports a change to the
// dispatcher. A backend whose repository lists none of the worker's labels cannot,
// whatever its health: checked here, under the lock, so that a health check racing
// with refreshLoadable cannot undo the availability that models brought.
//
// The status is queued under the lock too (send never blocks). A status is sent only
// on a change, so the last one the dispatcher reads must be the last change made: a
// task's "unavailable" and the health poller's "available" queued after the lock let
// go could leave in the opposite order, and the dispatcher would keep the stale word
// for good.
func (a *agent) setAvailable(available bool, reason string) {
	a.mu.Lock()
	if available && a.noModels {
		available, reason = false, "backend's repository lists none of this worker's labels yet"
	}
	changed := available != a.available
	a.available, a.unavailableReason = available, reason
	if changed && !a.draining {
		a.cur.Load().send(statusFrame(available, reason))
	}
	a.mu.Unlock()
	if changed {
		a.log.Info().Bool("available", available).Str("reason", reason).Msg("backend availability changed")
	}
}

func statusFrame(accepting bool, reason string) *pb.Envelope {
	return &pb.Envelope{Body: &pb.Envelope_Status{Status: &pb.WorkerStatus{Accepting: accepting, Reason: frameText(reason)}}}
}

// dialBatching dials TCP and wraps the socket so that the session's writer can put
// the frames it has queued into one write (see session.writeLoop).
func dialBatching(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return frame.NewBatchConn(c), nil
}
