// Package triton is the worker agent's backend over a Triton Inference Server's HTTP API
// (KServe v2 plus the model repository extension), with Triton started in explicit
// model-control mode. A label is a model in Triton's repository.
//
// What it does, following ../../../../shared/TRITON.md:
//   - WaitStarted waits for GET /v2/health/live, then for no model LOADING in the index
//     (a load an earlier agent process left under way); Inventory reads the repository index
//     (POST /v2/repository/index): every model listed is loadable, those READY are loaded
//     (but for names no label can be, which the dispatcher would refuse).
//   - Health is GET /v2/health/live (never /v2/health/ready, which is false while any
//     model loads or unloads), and fails while Triton refuses loads for not being in
//     explicit mode, once it has refused one (a misconfigured worker: the load fails
//     with backend.ErrUnavailable, not as the model's failure).
//   - Load is the blocking POST /v2/repository/models/{m}/load under LoadTimeout.
//     Concurrent Loads of one model share one request; a load that times out is unloaded
//     again so that it does not hold memory nobody tracks.
//   - Unload is POST /v2/repository/models/{m}/unload, which returns as soon as the
//     unload starts, followed by polling the index until the model has left UNLOADING
//     (UNAVAILABLE or absent), all under UnloadTimeout: only then is its memory free.
//     An unload Triton took but that has not ended fails with backend.ErrUnloading;
//     any other failure may leave the model loaded, and it stays this backend's.
//   - Loads and unloads of one model never overlap.
//   - A failed index read in these waits is made again after a backoff: up to
//     indexTries in a row in a load or an unload, until StartTimeout at start.
//   - Index reads, unloads and inferences (but those of a sequence) may be sent twice,
//     so Go's transport resends them when a kept-alive connection turns out closed; a
//     load never is, and goes out on a new connection.
//   - Any non-2xx answer is a failure carrying Triton's {"error": "..."} message, since
//     servers before late 2023 answer 400 for almost everything.
//
// Task types: "infer" posts parameters_json, a KServe v2 infer request body, to
// /v2/models/{label}/infer and returns Triton's JSON answer as the result;
// "embed_texts" sends {"texts": [...]} as a BYTES input of shape [n, 1] named TextInput,
// asks for the FP32 output EmbeddingOutput and returns {"embeddings": [[...], ...]}.
package triton

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/smartroute/smartroute/proto/frame"
	"github.com/smartroute/smartroute/worker-agent/backend"
)

// Name is the backend name used in --backend and in the hello's agent string.
const Name = "triton"

// Task types the backend runs.
const (
	TaskInfer      = "infer"
	TaskEmbedTexts = "embed_texts"
)

// Ops are the calls an Error's Op names, and OnError is called with.
const (
	OpLoad   = "load"
	OpUnload = "unload"
	OpInfer  = "infer"
	OpIndex  = "index"
	OpLive   = "live"
	// OpReady is the model readiness check an infer makes when Triton says the model
	// is not there. Its "not ready" answers (400, 404) are what it asks for, so only
	// no answer or a 5xx counts as its failure.
	OpReady = "ready"
)

// Ops lists every Op, so that a caller can make a zero series for each up front.
func Ops() []string { return []string{OpLoad, OpUnload, OpInfer, OpIndex, OpLive, OpReady} }

// Defaults filled in by WithDefaults.
const (
	DefaultURL             = "http://127.0.0.1:8000"
	DefaultLoadTimeout     = 10 * time.Minute
	DefaultUnloadTimeout   = 2 * time.Minute
	DefaultStartTimeout    = 5 * time.Minute
	DefaultPollInterval    = 100 * time.Millisecond
	DefaultTextInput       = "TEXT"
	DefaultEmbeddingOutput = "sentence_embedding"
	DefaultMaxAnswerSize   = 32 << 20
	DefaultMaxIdleConns    = 16
)

// notExplicitMessage starts Triton's answer to a load or an unload when it is not in
// explicit model-control mode (503, or 400 from servers before late 2023).
const notExplicitMessage = "explicit model load / unload is not allowed"

// maxErrorBody bounds how much of an error answer is read for its message.
const maxErrorBody = 64 << 10

// indexTries bounds the index reads in a row a load or an unload makes before giving
// up: a repository on a network volume fails a read now and then (Triton's 500
// "failed to poll the model repository"), and one such hiccup must not fail a load.
const indexTries = 5

// maxIndexBackoff caps the wait between failed index reads (PollInterval if longer).
const maxIndexBackoff = 2 * time.Second

// Config configures the backend. Each field's comment says what its zero value means.
type Config struct {
	// URL is Triton's HTTP endpoint. Empty means DefaultURL (http://127.0.0.1:8000).
	URL string
	// LoadTimeout bounds one model load (Triton's load call blocks until the model is
	// ready, which can take minutes for a large model). Zero means 10m.
	LoadTimeout time.Duration
	// UnloadTimeout bounds one unload: the call plus the wait for the model to leave
	// UNLOADING. Zero means 2m.
	UnloadTimeout time.Duration
	// StartTimeout bounds WaitStarted's wait for Triton to become live, and for loads
	// found under way to end, when the agent starts. Zero means 5m.
	StartTimeout time.Duration
	// PollInterval is how often the index is read while waiting for an unload to end,
	// and how often liveness is checked while waiting for Triton to start. Zero means
	// 100ms.
	PollInterval time.Duration
	// TextInput names the BYTES input embed_texts fills. Empty means "TEXT".
	TextInput string
	// EmbeddingOutput names the FP32 output embed_texts reads. Empty means
	// "sentence_embedding".
	EmbeddingOutput string
	// MaxAnswerSize bounds how much of a successful answer (an infer result, the
	// index) is read; a larger answer is a failure. Zero means 32 MiB.
	MaxAnswerSize int64
	// MaxIdleConns is how many idle keep-alive connections to Triton the backend's own
	// client keeps. Fewer than the calls made at once (tasks, plus the health check,
	// index reads and unloads) and every burst beyond it dials anew: a handshake per
	// inference and TIME_WAIT sockets piling up. Zero means 16; the agent sets its
	// Slots plus a few. Unused with Client.
	MaxIdleConns int
	// Client sends the requests. Nil means a client of its own with no overall timeout
	// (every call is bounded by its context), which sends each load on a connection of
	// its own (see Backend.loadClient).
	Client *http.Client
	// Log receives the backend's records. The zero logger writes nothing.
	Log zerolog.Logger
	// OnError, when set, is called with the Op of every failed Triton call (the agent
	// counts them in its metrics), always one of Ops. Nil means none.
	OnError func(op string)
}

// WithDefaults returns a copy of c with zero values replaced by their defaults.
func (c Config) WithDefaults() Config {
	if c.URL == "" {
		c.URL = DefaultURL
	}
	setDuration(&c.LoadTimeout, DefaultLoadTimeout)
	setDuration(&c.UnloadTimeout, DefaultUnloadTimeout)
	setDuration(&c.StartTimeout, DefaultStartTimeout)
	setDuration(&c.PollInterval, DefaultPollInterval)
	if c.TextInput == "" {
		c.TextInput = DefaultTextInput
	}
	if c.EmbeddingOutput == "" {
		c.EmbeddingOutput = DefaultEmbeddingOutput
	}
	if c.MaxAnswerSize == 0 {
		c.MaxAnswerSize = DefaultMaxAnswerSize
	}
	if c.MaxIdleConns == 0 {
		c.MaxIdleConns = DefaultMaxIdleConns
	}
	return c
}

func setDuration(d *time.Duration, def time.Duration) {
	if *d == 0 {
		*d = def
	}
}

// Validate checks a config that went through WithDefaults; each message names the field.
func (c Config) Validate() error {
	var errs []error
	u, err := url.Parse(c.URL)
	switch {
	case err != nil:
		errs = append(errs, fmt.Errorf("URL %q: %w", c.URL, err))
	case u.Scheme != "http" && u.Scheme != "https":
		errs = append(errs, fmt.Errorf("URL %q must start with http:// or https://", c.URL))
	case u.Host == "":
		errs = append(errs, fmt.Errorf("URL %q has no host", c.URL))
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{
		{"LoadTimeout", c.LoadTimeout}, {"UnloadTimeout", c.UnloadTimeout},
		{"StartTimeout", c.StartTimeout}, {"PollInterval", c.PollInterval},
	} {
		if f.d < 0 {
			errs = append(errs, fmt.Errorf("%s must not be negative, got %s", f.name, f.d))
		}
	}
	if c.MaxAnswerSize < 0 {
		errs = append(errs, fmt.Errorf("MaxAnswerSize must not be negative, got %d", c.MaxAnswerSize))
	}
	if c.MaxIdleConns < 0 {
		errs = append(errs, fmt.Errorf("MaxIdleConns must not be negative, got %d", c.MaxIdleConns))
	}
	return errors.Join(errs...)
}

// Error is a failed Triton call: a non-2xx answer (StatusCode and Triton's message) or
// no answer at all (StatusCode 0 and Err).
type Error struct {
	Op         string // one of Ops
	Model      string // empty for server-wide calls
	StatusCode int
	Message    string // Triton's {"error": ...}, or the body's text
	Err        error  // the transport error when there was no answer
}

func (e *Error) Error() string {
	what := "triton " + e.Op
	if e.Model != "" {
		what += fmt.Sprintf(" %q", e.Model)
	}
	if e.StatusCode == 0 {
		return fmt.Sprintf("%s: %v", what, e.Err)
	}
	return fmt.Sprintf("%s: %s (HTTP %d)", what, e.Message, e.StatusCode)
}

func (e *Error) Unwrap() error { return e.Err }

// Backend runs tasks on a Triton server.
type Backend struct {
	cfg    Config
	base   string // URL without a trailing slash
	client *http.Client
	// loadClient sends loads. A load cannot be sent again when its connection drops
	// before the answer (a second load of a model still loading loads it twice,
	// TRITON.md), so it must not go out on a kept-alive connection Triton or a proxy
	// may have closed meanwhile: ours opens a new one for each load, a small cost next
	// to a load's seconds. A caller's Client is used as it is.
	loadClient *http.Client
	log        zerolog.Logger

	mu     sync.Mutex
	models map[string]*modelOps // per model, created on first use
	loaded map[string]bool      // models this backend loaded (or found loaded) and has not unloaded
	// abandoned are models whose load was given up and whose unload did not end in
	// time: Triton may still be loading them (it runs the unload once the load ends),
	// holding memory nothing counts. Loads wait for them (waitForRoom).
	abandoned map[string]bool
	// refused is the last load Triton refused for not being in explicit model-control
	// mode, nil when it has taken one since: Health fails while Triton still refuses.
	refused *Error

	joinedLoad func(label string) // test hook: a Load has joined label's load call
}

// modelOps serialises the loads and unloads of one model and merges concurrent loads.
type modelOps struct {
	lock chan struct{} // holds a token while a load or unload of the model is under way
	load *loadCall     // the load callers can join; guarded by Backend.mu
}

// loadCall is one load request shared by every Load that joined it. It is cancelled
// when the last of them gives up.
type loadCall struct {
	done    chan struct{} // closed when err is set
	err     error
	waiters int // guarded by Backend.mu
	cancel  context.CancelFunc
}

var (
	_ backend.Backend = (*Backend)(nil)
	_ backend.Starter = (*Backend)(nil)
)

// New returns a Triton backend. It makes no request.
func New(cfg Config) (*Backend, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	client, loadClient := cfg.Client, cfg.Client
	if client == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		// Go keeps 2 idle connections per host by default; every call goes to one host.
		t.MaxIdleConnsPerHost = cfg.MaxIdleConns
		t.MaxIdleConns = max(t.MaxIdleConns, cfg.MaxIdleConns)
		client = &http.Client{Transport: t}
		lt := t.Clone()
		lt.DisableKeepAlives = true
		loadClient = &http.Client{Transport: lt}
	}
	return &Backend{
		cfg:        cfg,
		base:       strings.TrimRight(cfg.URL, "/"),
		client:     client,
		loadClient: loadClient,
		log:        cfg.Log,
		models:     make(map[string]*modelOps),
		loaded:     make(map[string]bool),
		abandoned:  make(map[string]bool),
	}, nil
}

// Name returns "triton".
func (b *Backend) Name() string { return Name }

// WaitStarted waits until Triton is live and no model is LOADING, up to StartTimeout
// or until ctx ends. A load found under way was left by a previous agent process
// (Triton goes on loading after its client is gone); once done, the model holds
// memory, so Inventory must see how it ended rather than leave it uncounted.
func (b *Backend) WaitStarted(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.StartTimeout)
	defer cancel()
	if err := b.waitLive(ctx); err != nil {
		return err
	}
	// Failed index reads are tried again until StartTimeout: given up on, a load still
	// under way would end READY after Inventory, holding memory nobody counts.
	loading, err := b.awaitIndex(ctx, firstInState("LOADING"), func(loading string) {
		b.log.Info().Str("label", loading).Msg("waiting for a load under way at start to end")
	}, 0)
	switch {
	case err == nil:
		return nil
	case errors.Is(ctx.Err(), context.DeadlineExceeded) && loading != "":
		return fmt.Errorf("triton at %s: model %q still LOADING after %s: %w", b.cfg.URL, loading, b.cfg.StartTimeout, err)
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return fmt.Errorf("triton at %s: repository index not readable within %s: %w", b.cfg.URL, b.cfg.StartTimeout, err)
	case ctx.Err() != nil:
		return ctx.Err()
	}
	return err
}

// waitLive waits until Triton is live or ctx ends.
func (b *Backend) waitLive(ctx context.Context) error {
	err := b.live(ctx)
	if err == nil {
		return nil
	}
	b.log.Info().Err(err).Str("triton_url", b.cfg.URL).Msg("waiting for triton to become live")
	t := time.NewTicker(b.cfg.PollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("triton at %s not live within %s: %w", b.cfg.URL, b.cfg.StartTimeout, err)
			}
			return ctx.Err()
		case <-t.C:
		}
		if err = b.live(ctx); err == nil {
			b.log.Info().Str("triton_url", b.cfg.URL).Msg("triton is live")
			return nil
		}
	}
}

// Inventory reads the repository index: every model in it is loadable, those READY are
// loaded. Their order is the index's (by name): Triton does not say which was used last.
func (b *Backend) Inventory(ctx context.Context) (backend.Inventory, error) {
	entries, err := b.index(ctx)
	if err != nil {
		return backend.Inventory{}, err
	}
	inv := backend.Inventory{Loadable: indexNames(entries), Loaded: indexLoaded(entries)}
	for _, name := range inv.Loaded {
		b.setLoaded(name, true)
	}
	ev := b.log.Info()
	if left := leftOut(entries); len(left) > 0 {
		ev = b.log.Warn().Strs("left_out", left)
	}
	ev.Strs("loadable", inv.Loadable).Strs("loaded", inv.Loaded).Msg("triton repository index read")
	return inv, nil
}

// Loadable lists the models in Triton's repository index, for the agent's periodic
// inventory check. Unlike Inventory it records nothing about what is loaded.
func (b *Backend) Loadable(ctx context.Context) ([]string, error) {
	entries, err := b.index(ctx)
	if err != nil {
		return nil, err
	}
	return indexNames(entries), nil
}

// indexNames lists the models of an index once each (an entry per version may repeat
// a name), in index order, in time linear in the index's length: a repository of
// many thousand models is read every InventoryInterval. A name no task can name (see
// labelName) is left out.
func indexNames(entries []indexEntry) []string {
	var names []string
	seen := make(map[string]bool)
	for _, e := range entries {
		if labelName(e.Name) && !seen[e.Name] {
			seen[e.Name] = true
			names = append(names, e.Name)
		}
	}
	return names
}

// indexLoaded lists the models of an index READY in some version, as indexNames does.
func indexLoaded(entries []indexEntry) []string {
	var names []string
	seen := make(map[string]bool)
	for _, e := range entries {
		if e.State == "READY" && labelName(e.Name) && !seen[e.Name] {
			seen[e.Name] = true
			names = append(names, e.Name)
		}
	}
	return names
}

// labelName reports whether a model's name can be a label: 1 to frame.MaxLabelBytes
// bytes. The dispatcher refuses a hello or an Inventory listing any other, so one such
// model in the repository kept the worker from ever connecting; and no task can name
// it anyway.
func labelName(name string) bool { return frame.CheckLabel("model", name) == nil }

// leftOut lists the names of an index that are not labels, once each, quoted and cut
// for a log.
func leftOut(entries []indexEntry) []string {
	var out []string
	seen := make(map[string]bool)
	for _, e := range entries {
		if !labelName(e.Name) && e.Name != "" && !seen[e.Name] && len(out) < 10 {
			seen[e.Name] = true
			out = append(out, fmt.Sprintf("%.64q (%d bytes)", e.Name, len(e.Name)))
		}
	}
	return out
}

// Health reports whether Triton is live and, once it has refused a load for not being
// in explicit model-control mode, whether it still refuses them.
func (b *Backend) Health(ctx context.Context) error {
	if err := b.live(ctx); err != nil {
		return fmt.Errorf("triton is not live: %w", err)
	}
	return b.checkModelControl(ctx)
}

// checkModelControl fails while Triton refuses to load models, as it refused the last
// load: the worker then stays unavailable, saying how to fix it, rather than take a task
// each health interval only to refuse it at its load. It asks again with an unload of
// the model whose load was refused, which Triton refuses likewise or, in explicit mode,
// takes: a no-op for a model not loaded (TRITON.md). Not once the inventory counts that
// model as loaded (a Triton restarted with it preloaded): the unload would drop a model
// the dispatcher routes here, so the question is left to the next load, which a Triton
// still not in explicit mode refuses again.
func (b *Backend) checkModelControl(ctx context.Context) error {
	b.mu.Lock()
	refused := b.refused
	var m *modelOps
	if refused != nil && b.loaded[refused.Model] {
		b.refused, refused = nil, nil
	}
	if refused != nil {
		m = b.ops(refused.Model)
	}
	b.mu.Unlock()
	if refused == nil {
		return nil
	}
	// Under the model's lock, so that the unload cannot overlap a load of it; a load
	// under way settles the question itself.
	select {
	case m.lock <- struct{}{}:
	default:
		return b.notExplicit(refused)
	}
	defer m.release()
	_, err := b.call(ctx, OpUnload, refused.Model, http.MethodPost, "/v2/repository/models/"+url.PathEscape(refused.Model)+"/unload", nil, true)
	var te *Error
	switch {
	case err == nil:
		b.mu.Lock()
		if b.refused == refused {
			b.refused = nil
		}
		b.mu.Unlock()
		b.log.Info().Str("triton_url", b.cfg.URL).Msg("triton takes model loads again")
		return nil
	case errors.As(err, &te) && refusesModelControl(te):
		return b.notExplicit(te)
	}
	return fmt.Errorf("%w (asking again failed: %w)", b.notExplicit(refused), err)
}

// refusesModelControl reports whether te is Triton refusing a load or unload because it
// is not in explicit model-control mode.
func refusesModelControl(te *Error) bool {
	return te.StatusCode != 0 && strings.Contains(te.Message, notExplicitMessage)
}

// notExplicit is the error of a load Triton refused for not being in explicit
// model-control mode: a misconfiguration of the worker, not the model's failure, so it
// wraps backend.ErrUnavailable and names the fix.
func (b *Backend) notExplicit(te *Error) error {
	return fmt.Errorf("triton at %s loads no model: it is not in explicit model-control mode (start it with --model-control-mode=explicit): %w: %w", b.cfg.URL, backend.ErrUnavailable, te)
}

func (b *Backend) live(ctx context.Context) error {
	_, err := b.call(ctx, OpLive, "", http.MethodGet, "/v2/health/live", nil, true)
	return err
}

// indexEntry is one row of the repository index; a model never loaded has only Name.
type indexEntry struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	State   string `json:"state"`
	Reason  string `json:"reason"`
}

func (b *Backend) index(ctx context.Context) ([]indexEntry, error) {
	body, err := b.call(ctx, OpIndex, "", http.MethodPost, "/v2/repository/index", []byte(`{}`), true)
	if err != nil {
		return nil, err
	}
	return decodeIndex(body)
}

// decodeIndex reads the repository index: a JSON array of models. null is not one
// (Triton answers [] for an empty repository): taken for an empty index, it told an
// unload waiting for its model to leave UNLOADING, and a start waiting for loads under
// way, that nothing held memory.
func decodeIndex(body []byte) ([]indexEntry, error) {
	var entries []indexEntry
	if err := json.Unmarshal(body, &entries); err != nil {
		return nil, fmt.Errorf("triton index: answer is not a JSON array of models: %w", err)
	}
	if entries == nil {
		return nil, fmt.Errorf("triton index: answer is %.32q, not a JSON array of models", bytes.TrimSpace(body))
	}
	return entries, nil
}

func (b *Backend) setLoaded(label string, loaded bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if loaded {
		b.loaded[label] = true
	} else {
		delete(b.loaded, label)
	}
}

func (b *Backend) ops(label string) *modelOps {
	m := b.models[label]
	if m == nil {
		m = &modelOps{lock: make(chan struct{}, 1)}
		b.models[label] = m
	}
	return m
}

// lock takes label's operation lock, or returns ctx's error.
func (m *modelOps) acquire(ctx context.Context) error {
	select {
	case m.lock <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (m *modelOps) release() { <-m.lock }

// Load loads label with Triton's blocking load call, bounded by LoadTimeout. Concurrent
// Loads of one label share one request; each returns when it ends or its own ctx does.
func (b *Backend) Load(ctx context.Context, label string) error {
	if label == "" {
		return errors.New("triton load: empty label")
	}
	b.mu.Lock()
	m := b.ops(label)
	c := m.load
	if c == nil {
		// The load runs under its own context so that one caller giving up does not
		// abort it for the others; the last caller to give up cancels it.
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.cfg.LoadTimeout)
		c = &loadCall{done: make(chan struct{}), cancel: cancel}
		m.load = c
		go b.runLoad(lctx, label, m, c)
	}
	c.waiters++
	b.mu.Unlock()
	if b.joinedLoad != nil {
		b.joinedLoad(label)
	}

	select {
	case <-c.done:
		return c.err
	case <-ctx.Done():
		b.mu.Lock()
		c.waiters--
		if c.waiters == 0 {
			c.cancel()
			if m.load == c {
				m.load = nil // a later Load starts afresh rather than join a cancelled one
			}
		}
		b.mu.Unlock()
		return ctx.Err()
	}
}

func (b *Backend) runLoad(ctx context.Context, label string, m *modelOps, c *loadCall) {
	defer c.cancel()
	err := m.acquire(ctx)
	if err != nil {
		// Said like Unload's: the dispatcher records this text as the label's load error.
		err = fmt.Errorf("triton load %q: waiting for the operation under way: %w", label, err)
	} else {
		// Memory an unload frees is free only once the model has left UNLOADING;
		// loading into it earlier has crashed Triton.
		if err = b.waitForRoom(ctx, label); err == nil {
			err = b.load(ctx, label)
			var te *Error
			// A refused connection sent nothing: there is nothing to clean up.
			noAnswer := errors.As(err, &te) && te.StatusCode == 0 && !errors.Is(err, backend.ErrUnavailable)
			if err != nil && (ctx.Err() != nil || noAnswer) {
				// Triton goes on loading after the client gives up (timed out, or every
				// caller gave up) or loses the answer (a dropped connection); unload,
				// still holding the model's lock, so that the model does not hold memory
				// the agent does not count and the next load of it does not overlap
				// this one.
				uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.cfg.UnloadTimeout)
				if uerr := b.unload(uctx, label); uerr != nil {
					b.log.Warn().Err(uerr).Str("label", label).Msg("unload after an abandoned load failed; loads wait until it holds no memory")
					b.mu.Lock()
					b.abandoned[label] = true
					b.mu.Unlock()
				}
				cancel()
				if errors.Is(ctx.Err(), context.DeadlineExceeded) {
					err = fmt.Errorf("triton load %q: no answer within %s: %w", label, b.cfg.LoadTimeout, err)
				}
			}
			switch {
			case err == nil:
			case errors.As(err, &te) && refusesModelControl(te):
				b.mu.Lock()
				b.refused = te
				b.mu.Unlock()
				err = b.notExplicit(te)
			case errors.As(err, &te) && te.StatusCode == http.StatusServiceUnavailable:
				// Triton, or a proxy before it, cannot take the load now: nothing was
				// loaded, and the model is not at fault.
				err = fmt.Errorf("%w: %w", backend.ErrUnavailable, err)
			}
		}
		// Released once the load is marked, so that an Unload waiting for the lock
		// cannot run in between and be undone by the mark.
		defer m.release()
	}
	b.mu.Lock()
	if m.load == c {
		m.load = nil
	}
	if err == nil {
		b.loaded[label] = true
		delete(b.abandoned, label) // loaded again: ours, and counted
		b.refused = nil            // Triton takes loads
	}
	c.err = err
	b.mu.Unlock()
	close(c.done)
}

// waitForRoom polls the index until no model is UNLOADING and no abandoned model is
// still loading, so that a load never goes into room an unload (ours that timed out,
// or anyone's) has not freed yet. An abandoned model Triton finished loading and kept
// (its queued unload lost) is unloaded first. An index it cannot read fails with
// backend.ErrUnavailable.
func (b *Backend) waitForRoom(ctx context.Context, label string) error {
	var ready []string // abandoned models READY at the last index read
	unloading, err := b.awaitIndex(ctx, func(entries []indexEntry) string {
		if name := firstInState("UNLOADING")(entries); name != "" {
			return name
		}
		ready = ready[:0]
		b.mu.Lock()
		defer b.mu.Unlock()
		for name := range b.abandoned {
			switch heldState(entries, name) {
			case "": // its memory is free
				delete(b.abandoned, name)
			case "READY":
				if name != label { // loading it again makes it ours
					ready = append(ready, name)
				}
			default: // LOADING, UNLOADING
				return name
			}
		}
		return ""
	}, func(unloading string) {
		b.log.Info().Str("label", label).Str("waiting_for", unloading).Msg("waiting for an unload, or an abandoned load, to end before loading")
	}, indexTries)
	if err == nil {
		for _, name := range ready {
			if err := b.unloadAbandoned(ctx, name); err != nil {
				return fmt.Errorf("triton load %q: model %q, whose load was abandoned, still holds memory: %w", label, name, err)
			}
		}
		return nil
	}
	if ctx.Err() != nil && unloading != "" {
		return fmt.Errorf("triton load %q: model %q still UNLOADING or LOADING: %w", label, unloading, ctx.Err())
	}
	// No load was sent, and the model is not at fault: the agent must not report the
	// label's LOAD_FAILED, which counts towards marking it failing on every worker.
	if !errors.Is(err, backend.ErrUnavailable) {
		err = fmt.Errorf("%w: %w", backend.ErrUnavailable, err)
	}
	return fmt.Errorf("triton load %q: reading the index before loading: %w", label, err)
}

// unloadAbandoned unloads a model whose load was abandoned and which Triton kept,
// under its own lock; one that a load or unload holds now is left to it.
func (b *Backend) unloadAbandoned(ctx context.Context, name string) error {
	b.mu.Lock()
	m := b.ops(name)
	b.mu.Unlock()
	select {
	case m.lock <- struct{}{}:
	default:
		return nil // being loaded or unloaded: that call settles it
	}
	defer m.release()
	uctx, cancel := context.WithTimeout(ctx, b.cfg.UnloadTimeout)
	defer cancel()
	if err := b.unload(uctx, name); err != nil {
		return err
	}
	b.mu.Lock()
	delete(b.abandoned, name)
	b.mu.Unlock()
	b.log.Info().Str("label", name).Msg("unloaded a model whose load was abandoned")
	return nil
}

// firstInState returns an awaitIndex test that finds the first model in state.
func firstInState(state string) func([]indexEntry) string {
	return func(entries []indexEntry) string {
		for _, e := range entries {
			if e.State == state {
				return e.Name
			}
		}
		return ""
	}
}

// awaitIndex reads the index, at once and then every PollInterval, until pending
// finds nothing in it to wait for (""). onWait hears the first thing it waits for. A
// failed read is made again after a backoff doubling from PollInterval, until tries
// reads in a row have failed, or (tries 0) until ctx ends. On an error it returns what
// it was still waiting for, "" if nothing yet.
func (b *Backend) awaitIndex(ctx context.Context, pending func([]indexEntry) string, onWait func(string), tries int) (string, error) {
	var (
		waiting  string
		told     bool
		failures int
	)
	for {
		entries, err := b.index(ctx)
		delay := b.cfg.PollInterval
		if err != nil {
			failures++
			if ctx.Err() != nil || failures == tries {
				return waiting, err
			}
			if failures == 1 {
				b.log.Warn().Err(err).Msg("reading the repository index failed; reading it again")
			}
			delay = min(b.cfg.PollInterval<<min(failures-1, 10), max(maxIndexBackoff, b.cfg.PollInterval))
		} else {
			failures = 0
			if waiting = pending(entries); waiting == "" {
				return "", nil
			}
			if !told && onWait != nil {
				onWait(waiting)
			}
			told = true
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			if err != nil {
				return waiting, fmt.Errorf("%w (the last index read failed: %w)", ctx.Err(), err)
			}
			return waiting, ctx.Err()
		case <-t.C:
		}
	}
}

func (b *Backend) load(ctx context.Context, label string) error {
	_, err := b.call(ctx, OpLoad, label, http.MethodPost, "/v2/repository/models/"+url.PathEscape(label)+"/load", nil, false)
	return err
}

// Unload starts unloading label and waits until the index shows it has left UNLOADING,
// bounded by UnloadTimeout. Unloading a model that is not loaded is a no-op. An error
// wraps backend.ErrUnloading when Triton took the unload but it has not ended yet (the
// next Load waits for it); otherwise the model may still be loaded, and stays this
// backend's to load again if Triton loses it.
func (b *Backend) Unload(ctx context.Context, label string) error {
	b.mu.Lock()
	m := b.ops(label)
	b.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, b.cfg.UnloadTimeout)
	defer cancel()
	if err := m.acquire(ctx); err != nil {
		return fmt.Errorf("triton unload %q: waiting for the operation under way: %w", label, err)
	}
	defer m.release()
	err := b.unload(ctx, label)
	if err == nil || errors.Is(err, backend.ErrUnloading) {
		b.setLoaded(label, false)
	}
	return err
}

func (b *Backend) unload(ctx context.Context, label string) error {
	// Sent again as often as need be: Triton answers an unload of a model unloading or
	// not loaded with 200.
	if _, err := b.call(ctx, OpUnload, label, http.MethodPost, "/v2/repository/models/"+url.PathEscape(label)+"/unload", nil, true); err != nil {
		return err
	}
	// Triton took the unload: from here on it is under way, whatever the index says.
	state, err := b.awaitIndex(ctx, func(entries []indexEntry) string { return heldState(entries, label) }, nil, indexTries)
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		if state == "" {
			state = "UNLOADING" // until the index says otherwise
		}
		return fmt.Errorf("triton unload %q: still %s: %w: %w", label, state, backend.ErrUnloading, ctx.Err())
	}
	return fmt.Errorf("triton unload %q: waiting for the unload to end: %w: %w", label, backend.ErrUnloading, err)
}

// heldState is the state of a version of label that still holds memory (READY,
// LOADING, UNLOADING), UNLOADING first; "" when none does: the label is absent, never
// loaded, or every version is UNAVAILABLE. The index lists each version of a model
// on its own row.
func heldState(entries []indexEntry, label string) string {
	state := ""
	for _, e := range entries {
		if e.Name != label || e.State == "" || e.State == "UNAVAILABLE" {
			continue
		}
		if e.State == "UNLOADING" {
			return e.State
		}
		state = e.State
	}
	return state
}

// Run runs one task on a loaded label.
func (b *Backend) Run(ctx context.Context, task backend.Task) ([]byte, error) {
	switch task.Type {
	case TaskInfer:
		return b.runInfer(ctx, task)
	case TaskEmbedTexts:
		return b.runEmbed(ctx, task)
	default:
		return nil, fmt.Errorf("unknown task type %q; the triton backend runs %s and %s", task.Type, TaskInfer, TaskEmbedTexts)
	}
}

// runInfer posts the task's parameters, a KServe v2 infer request, and returns
// Triton's JSON answer.
func (b *Backend) runInfer(ctx context.Context, task backend.Task) ([]byte, error) {
	replayable, err := checkInferRequest(task.Params)
	if err != nil {
		return nil, fmt.Errorf("infer: %w", err)
	}
	return b.infer(ctx, task.Label, task.Params, replayable)
}

// checkInferRequest reads what runInfer must know of a producer's infer request: that
// it has inputs and asks for no binary output (the result must be JSON; the binary
// tensor extension answers raw bytes), and whether it is replayable: an inference is a
// read, safe to send twice, unless it belongs to a sequence, which a stateful model
// would advance twice.
//
// It reads keys as Triton does, exactly and each once. encoding/json matches a
// struct's keys in any case and keeps the last of a repeated key; Triton's parser
// (RapidJSON) matches exactly and finds the first. So
// {"parameters":{"sequence_id":1},"parameters":{}} was replayable here and a sequence
// there, and {"parameters":{"binary_data_output":true,"binary_data_output":false}}
// passed here and asked Triton for binary. A key repeated in an object read here is
// refused.
func checkInferRequest(params []byte) (replayable bool, err error) {
	const want = "parameters_json must be a KServe v2 infer request object"
	req, err := jsonObject(params)
	if err != nil || req == nil {
		return false, fmt.Errorf("%s: %w", want, cmp.Or(err, errors.New("it is empty or null")))
	}
	if !nonEmptyArray(req["inputs"]) {
		return false, errors.New(`parameters_json has no inputs (an "inputs" array of at least one)`)
	}
	top, err := jsonObject(req["parameters"])
	if err != nil {
		return false, fmt.Errorf("%s: parameters: %w", want, err)
	}
	binary := isTrue(top["binary_data_output"])
	if raw, ok := req["outputs"]; ok {
		var outputs []json.RawMessage
		if err := json.Unmarshal(raw, &outputs); err != nil {
			return false, fmt.Errorf("%s: outputs must be an array", want)
		}
		for i, o := range outputs {
			out, err := jsonObject(o)
			if err != nil {
				return false, fmt.Errorf("%s: outputs[%d]: %w", want, i, err)
			}
			p, err := jsonObject(out["parameters"])
			if err != nil {
				return false, fmt.Errorf("%s: outputs[%d].parameters: %w", want, i, err)
			}
			binary = binary || isTrue(p["binary_data"])
		}
	}
	if binary {
		return false, errors.New("binary_data outputs are not supported: the result must be JSON")
	}
	_, sequence := top["sequence_id"]
	return !sequence, nil
}

// jsonObject reads raw, a JSON object, into its members as written; nil for an absent
// value or null. A key given twice is an error.
func jsonObject(raw json.RawMessage) (map[string]json.RawMessage, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, errors.New("not a JSON object")
	}
	members := make(map[string]json.RawMessage)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, _ := tok.(string) // the decoder allows only a string here
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		if _, dup := members[key]; dup {
			return nil, fmt.Errorf("key %.64q is given twice (Triton would read the first one)", key)
		}
		members[key] = v
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("more after the object")
	}
	return members, nil
}

// nonEmptyArray reports whether raw, valid JSON, is an array of at least one element.
func nonEmptyArray(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '[' {
		return false
	}
	rest := bytes.TrimSpace(raw[1:])
	return len(rest) > 0 && rest[0] != ']'
}

// isTrue reports whether raw is JSON true.
func isTrue(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "true" }

// infer posts an infer request, which the transport may send again when replayable
// (see call). When Triton says the model is not there although this backend loaded it
// (Triton restarted, or someone unloaded it behind our back), it loads the model again
// and retries once; the reload counts in the task's run time.
func (b *Backend) infer(ctx context.Context, label string, body []byte, replayable bool) ([]byte, error) {
	path := "/v2/models/" + url.PathEscape(label) + "/infer"
	out, err := b.call(ctx, OpInfer, label, http.MethodPost, path, body, replayable)
	var te *Error
	if err == nil || !errors.As(err, &te) || te.StatusCode == 0 || te.StatusCode >= 500 && te.StatusCode != 503 {
		return out, err
	}
	b.mu.Lock()
	ours := b.loaded[label]
	b.mu.Unlock()
	if !ours {
		return nil, err
	}
	// 404 (unknown), 503 (unavailable) or, from an old server, 400 for anything: ask
	// whether the model is ready before blaming the request.
	_, rerr := b.send(ctx, OpReady, label, http.MethodGet, "/v2/models/"+url.PathEscape(label)+"/ready", nil, true)
	var re *Error
	answered := errors.As(rerr, &re) && re.StatusCode != 0
	if rerr != nil && (!answered || re.StatusCode >= 500) {
		b.failed(OpReady)
	}
	if rerr == nil || !answered {
		return nil, err
	}
	b.log.Warn().Err(err).Str("label", label).Msg("triton lost a loaded model; loading it again")
	// The load goes on if the task gives up, as the agent's own loads do: the label is
	// held in the agent's books, and a reload ended with each task whose deadline is
	// shorter than the load would never finish.
	reload := make(chan error, 1)
	go func() { reload <- b.Load(context.WithoutCancel(ctx), label) }()
	select {
	case lerr := <-reload:
		if lerr != nil {
			return nil, fmt.Errorf("%w: %w (loading it again failed: %w)", backend.ErrNotLoaded, err, lerr)
		}
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return b.call(ctx, OpInfer, label, http.MethodPost, path, body, replayable)
}

// embedResult is what embed_texts returns. The numbers are Triton's, as it wrote them.
type embedResult struct {
	Embeddings [][]json.Number `json:"embeddings"`
}

func (b *Backend) runEmbed(ctx context.Context, task backend.Task) ([]byte, error) {
	var params struct {
		Texts *[]string `json:"texts"`
	}
	if err := json.Unmarshal(task.Params, &params); err != nil {
		return nil, fmt.Errorf(`embed_texts: parameters_json must be {"texts": ["...", ...]}: %w`, err)
	}
	if params.Texts == nil || len(*params.Texts) == 0 {
		return nil, errors.New(`embed_texts: parameters_json must be {"texts": ["...", ...]} with at least one text`)
	}
	texts := *params.Texts
	req, err := json.Marshal(map[string]any{
		"inputs": []any{map[string]any{
			"name": b.cfg.TextInput, "datatype": "BYTES", "shape": []int{len(texts), 1}, "data": texts,
		}},
		"outputs": []any{map[string]any{"name": b.cfg.EmbeddingOutput}},
	})
	if err != nil {
		return nil, err
	}
	body, err := b.infer(ctx, task.Label, req, true)
	if err != nil {
		return nil, err
	}
	rows, err := embeddings(body, b.cfg.EmbeddingOutput, len(texts))
	if err != nil {
		return nil, fmt.Errorf("embed_texts on %q: %w", task.Label, err)
	}
	return json.Marshal(embedResult{Embeddings: rows})
}

// embeddings reads the rows of a float output from an infer answer; its data may be
// flat (row-major) or nested, and its shape says how to split it.
func embeddings(body []byte, output string, n int) ([][]json.Number, error) {
	var resp struct {
		Outputs []struct {
			Name     string          `json:"name"`
			Datatype string          `json:"datatype"`
			Shape    []int64         `json:"shape"`
			Data     json.RawMessage `json:"data"`
		} `json:"outputs"`
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&resp); err != nil {
		return nil, fmt.Errorf("answer is not a KServe v2 infer response: %w", err)
	}
	var names []string
	for _, o := range resp.Outputs {
		if o.Name != output {
			names = append(names, o.Name)
			continue
		}
		switch o.Datatype {
		case "FP32", "FP16", "BF16", "FP64":
		default:
			return nil, fmt.Errorf("output %q is %s, want FP32", output, o.Datatype)
		}
		var data any
		dec := json.NewDecoder(bytes.NewReader(o.Data))
		dec.UseNumber()
		if err := dec.Decode(&data); err != nil {
			return nil, fmt.Errorf("output %q data: %w", output, err)
		}
		flat, err := flattenNumbers(data, nil)
		if err != nil {
			return nil, fmt.Errorf("output %q data: %w", output, err)
		}
		if len(o.Shape) == 0 {
			return nil, fmt.Errorf("output %q has no shape", output)
		}
		total := int64(1)
		for _, d := range o.Shape {
			if d < 0 {
				return nil, fmt.Errorf("output %q has shape %v", output, o.Shape)
			}
			total *= d
		}
		if total != int64(len(flat)) {
			return nil, fmt.Errorf("output %q has shape %v but %d values", output, o.Shape, len(flat))
		}
		width := o.Shape[len(o.Shape)-1]
		if width == 0 || total/width != int64(n) {
			return nil, fmt.Errorf("output %q has shape %v, want %d rows (one per text)", output, o.Shape, n)
		}
		rows := make([][]json.Number, n)
		for i := range rows {
			rows[i] = flat[int64(i)*width : int64(i+1)*width : int64(i+1)*width]
		}
		return rows, nil
	}
	return nil, fmt.Errorf("no output %q in the answer (outputs: %q); set --triton-embedding-output", output, names)
}

func flattenNumbers(v any, out []json.Number) ([]json.Number, error) {
	switch v := v.(type) {
	case []any:
		for _, e := range v {
			var err error
			if out, err = flattenNumbers(e, out); err != nil {
				return nil, err
			}
		}
		return out, nil
	case json.Number:
		return append(out, v), nil
	default:
		return nil, fmt.Errorf("element %v is not a number", v)
	}
}

// call sends one request (see send) and reports a failure to OnError.
func (b *Backend) call(ctx context.Context, op, model, method, path string, body []byte, replayable bool) ([]byte, error) {
	out, err := b.send(ctx, op, model, method, path, body, replayable)
	if err != nil {
		b.failed(op)
	}
	return out, err
}

// failed tells OnError, if set, that a call of op failed.
func (b *Backend) failed(op string) {
	if b.cfg.OnError != nil {
		b.cfg.OnError(op)
	}
}

// send sends one request and returns the body of a 2xx answer, or an *Error carrying
// Triton's message for any other status. Loads go through loadClient.
//
// A replayable request is one Triton may receive twice to no harm. Go's transport then
// sends it again by itself, on a new connection, when a kept-alive connection turns out
// closed before any answer (Triton's or a proxy's idle timeout); otherwise it does that
// only for GET and HEAD, and the first call after an idle spell failed.
func (b *Backend) send(ctx context.Context, op, model, method, path string, body []byte, replayable bool) ([]byte, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, b.base+path, rd)
	if err != nil {
		return nil, &Error{Op: op, Model: model, Err: err}
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if replayable {
		// The transport's mark of an idempotent request; nil, it is not sent
		// (net/http's Transport documentation).
		req.Header["Idempotency-Key"] = nil
	}
	client := b.client
	if op == OpLoad {
		client = b.loadClient
	}
	resp, err := client.Do(req)
	if err != nil {
		var dial *net.OpError
		if errors.As(err, &dial) && dial.Op == "dial" { // nothing was sent
			err = fmt.Errorf("%w: %w", backend.ErrUnavailable, err)
		}
		return nil, &Error{Op: op, Model: model, Err: err}
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 == 2 {
		limit := b.cfg.MaxAnswerSize
		var out []byte
		if resp.ContentLength <= limit {
			if out, err = io.ReadAll(io.LimitReader(resp.Body, limit+1)); err != nil {
				return nil, &Error{Op: op, Model: model, Err: fmt.Errorf("reading the answer: %w", err)}
			}
		}
		if resp.ContentLength > limit || int64(len(out)) > limit {
			return nil, &Error{Op: op, Model: model, Err: fmt.Errorf("answer larger than %d bytes (MaxAnswerSize)", limit)}
		}
		return out, nil
	}
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	return nil, &Error{Op: op, Model: model, StatusCode: resp.StatusCode, Message: errorMessage(resp.StatusCode, raw)}
}

// errorMessage is Triton's {"error": "..."} message, else the body's text, else the
// status text (health endpoints answer 400 with an empty body), else "no message". It
// is never empty, and always UTF-8: the body may be a proxy's, in any encoding, and
// the message ends up in logs and frames.
func errorMessage(code int, raw []byte) string {
	var e struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(raw, &e) == nil && strings.TrimSpace(e.Error) != "" {
		return e.Error // encoding/json has made it UTF-8
	}
	if s := strings.TrimSpace(string(raw)); s != "" {
		return strings.ToValidUTF8(s, "\uFFFD")
	}
	if t := http.StatusText(code); t != "" {
		return t
	}
	return "no message"
}

// CloseIdleConnections closes the clients' idle keep-alive connections.
func (b *Backend) CloseIdleConnections() {
	b.client.CloseIdleConnections()
	b.loadClient.CloseIdleConnections()
}
