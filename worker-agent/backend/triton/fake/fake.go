// Package fake is a stand-in Triton Inference Server speaking Triton's HTTP API (KServe
// v2 plus the model repository and statistics extensions) in explicit model-control
// mode. Triton cannot run on our machines, so the agent's Triton backend is tested
// against this fake; it follows ../../../../../shared/TRITON.md (the facts we collected
// from Triton's docs and server source) including the awkward parts:
//
//   - errors are {"error": "..."} with NOT_FOUND 404, UNAVAILABLE 503, INTERNAL 500 and
//     invalid argument 400, or 400 for everything in old-server mode (SetOldErrors);
//   - GET /v2/health/live and /v2/health/ready answer 200 or 400 with an empty body,
//     and ready is false while any model is LOADING or UNLOADING;
//   - GET /v2/models/{m}/ready answers 200 when ready, 400 when known but not ready,
//     404 when unknown or unloaded;
//   - POST /v2/repository/index answers a top-level array in which a model never loaded
//     has only its name, and states are READY, UNAVAILABLE (reason "unloaded" after an
//     unload, the error after a failed load), LOADING and UNLOADING;
//   - POST /v2/repository/models/{m}/load blocks until the model is loaded or failed
//     (400 "load failed for model ...", 500 when the model folder is missing, 503 when
//     the server is not in explicit mode); loading a loaded model is a no-op; the load
//     goes on when the client gives up, as Triton's does;
//   - POST /v2/repository/models/{m}/unload answers 200 at once, also for a model that
//     is not loaded; the model stays UNLOADING for the unload delay and until its
//     in-flight requests end;
//   - two concurrent loads of one model really load it twice (Triton's known trouble),
//     and the fake records it (MaxConcurrentLoads) so tests can assert it never happens;
//   - POST /v2/models/{m}/infer computes deterministic FP32 outputs of shape
//     [batch, Dim] from the first input's rows (BYTES inputs carry JSON strings), so an
//     embedding can be checked with Embedding; GET /v2/models/{m}/stats reports only
//     loaded models (400 otherwise).
//
// Not implemented: the binary tensor extension (a request asking for it gets 400 saying
// so), model versions other than 1, the gRPC endpoint and metrics.
package fake

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Model states as the repository index spells them.
const (
	StateReady       = "READY"
	StateUnavailable = "UNAVAILABLE"
	StateLoading     = "LOADING"
	StateUnloading   = "UNLOADING"
)

// Defaults of the model interface the fake pretends every model has.
const (
	DefaultTextInput       = "TEXT"
	DefaultEmbeddingOutput = "sentence_embedding"
	DefaultDim             = 8
)

// Config sets up a fake server. Zero values are meaningful where said.
type Config struct {
	// Models are the model folders in the repository; each can be loaded.
	Models []string
	// Preload lists models loaded at start, as Triton's --load-model; each must be in
	// Models.
	Preload []string
	// LoadDelay is how long every load takes; zero means at once. SetLoadDelay overrides
	// it per model.
	LoadDelay time.Duration
	// UnloadDelay is how long every model stays UNLOADING after an unload starts; zero
	// means until its in-flight requests end (which may be at once).
	UnloadDelay time.Duration
	// Dim is the width of every FP32 output row; zero means DefaultDim.
	Dim int
	// OldErrors makes every error answer 400, as servers before late 2023 did.
	OldErrors bool
	// NotExplicit makes load and unload answer 503, as a server not started with
	// --model-control-mode=explicit does; SetNotExplicit changes it.
	NotExplicit bool
	// RepositoryDir, when set, is a model repository on disk besides Models: each
	// folder in it is a model, read at every index and load as Triton reads its
	// repository, so that a folder added (an upload) or removed while the server runs
	// shows there.
	RepositoryDir string
}

// Server is the fake. It is an http.Handler; serve it with httptest.NewServer or
// http.Server. Call Close when done so that loads and unloads held by the test or
// waiting out a delay end.
type Server struct {
	cfg    Config
	mux    *http.ServeMux
	closed chan struct{} // closed by Close
	bg     sync.WaitGroup

	mu            sync.Mutex
	live          bool
	down          bool
	oldErrors     bool
	notExplicit   bool
	nested        bool
	models        map[string]*model
	events        []string
	subscribers   []chan string
	loadsUnderway []string // "b while a UNLOADING", for loads that came while a model (b itself too) was unloading
	failIndex     int      // index requests left to fail with 500 (FailIndex)
}

// model is one model folder and its state. Guarded by Server.mu.
type model struct {
	name        string
	inRepo      bool
	inDir       bool   // its folder was in RepositoryDir at the last read
	state       string // "" means never loaded
	reason      string
	loadDelay   *time.Duration
	unloadDelay *time.Duration
	failReason  string        // non-empty: loads fail with it
	holdLoad    chan struct{} // non-nil: loads wait for it to close
	holdUnload  chan struct{} // non-nil: unloads wait for it to close

	loadsInFlight      int
	maxConcurrentLoads int
	loadRequests       int
	loads              int
	unloadAfterLoad    bool
	unloadDone         chan struct{} // closed when the current UNLOADING ends

	inferInFlight int
	inferIdle     chan struct{} // closed when inferInFlight drops to zero

	inferenceCount, executionCount uint64
	successCount, successNs        uint64
	failCount, failNs              uint64
	lastInference                  int64
}

// New returns a live fake server.
func New(cfg Config) *Server {
	if cfg.Dim <= 0 {
		cfg.Dim = DefaultDim
	}
	s := &Server{
		cfg:       cfg,
		closed:    make(chan struct{}),
		live:      true,
		oldErrors: cfg.OldErrors,
		models:    make(map[string]*model),
	}
	s.notExplicit = cfg.NotExplicit
	for _, name := range cfg.Models {
		s.models[name] = &model{name: name, inRepo: true}
	}
	for _, name := range cfg.Preload {
		if m := s.models[name]; m != nil {
			m.state = StateReady
			m.loads++
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v2", s.serverMetadata)
	mux.HandleFunc("GET /v2/health/live", s.healthLive)
	mux.HandleFunc("GET /v2/health/ready", s.healthReady)
	mux.HandleFunc("POST /v2/repository/index", s.index)
	mux.HandleFunc("POST /v2/repository/models/{model}/load", s.load)
	mux.HandleFunc("POST /v2/repository/models/{model}/unload", s.unload)
	for _, prefix := range []string{"/v2/models/{model}", "/v2/models/{model}/versions/{version}"} {
		mux.HandleFunc("GET "+prefix, s.modelMetadata)
		mux.HandleFunc("GET "+prefix+"/ready", s.modelReady)
		mux.HandleFunc("POST "+prefix+"/infer", s.infer)
		mux.HandleFunc("GET "+prefix+"/stats", s.stats)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.fail(w, http.StatusNotFound, "Not Found")
	})
	s.mux = mux
	return s
}

// ServeHTTP serves Triton's HTTP API, or drops the connection while the server is down.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	down := s.down
	s.mu.Unlock()
	if down {
		if hj, ok := w.(http.Hijacker); ok {
			if conn, _, err := hj.Hijack(); err == nil {
				_ = conn.Close()
				return
			}
		}
		panic(http.ErrAbortHandler) // closes the connection without an answer
	}
	s.mux.ServeHTTP(w, r)
}

// Close releases every held load and unload and ends every delay, then waits for the
// background work to finish. The server still answers afterwards.
func (s *Server) Close() {
	s.mu.Lock()
	select {
	case <-s.closed:
	default:
		close(s.closed)
	}
	s.mu.Unlock()
	s.bg.Wait()
}

// SetLive makes /v2/health/live answer 200 (true) or 400 (false).
func (s *Server) SetLive(live bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.live = live
}

// SetDown makes the server drop every connection without an answer (true), as a
// server that is gone does, or serve again (false).
func (s *Server) SetDown(down bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = down
}

// FailIndex makes the next n repository index requests fail with 500, as a repository
// Triton cannot read for a moment (a network volume) does.
func (s *Server) FailIndex(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failIndex = n
}

// SetNotExplicit makes load and unload answer 503 (true), as a server not started
// with --model-control-mode=explicit does, or take them again (false), as the server
// restarted with it does.
func (s *Server) SetNotExplicit(notExplicit bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.notExplicit = notExplicit
}

// SetOldErrors switches old-server mode: every error answers 400.
func (s *Server) SetOldErrors(old bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.oldErrors = old
}

// SetNestedOutputs makes infer answers carry nested rows ([[...],[...]]) instead of
// flat row-major data.
func (s *Server) SetNestedOutputs(nested bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nested = nested
}

// SetLoadDelay sets how long loads of name take.
func (s *Server) SetLoadDelay(name string, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.modelLocked(name).loadDelay = &d
}

// SetUnloadDelay sets how long name stays UNLOADING.
func (s *Server) SetUnloadDelay(name string, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.modelLocked(name).unloadDelay = &d
}

// FailLoads makes loads of name fail with reason; an empty reason lets them succeed.
func (s *Server) FailLoads(name, reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.modelLocked(name).failReason = reason
}

// RemoveModel deletes name's folder from the repository: it leaves the index, and a
// load of it answers 500. A loaded model stays loaded, as in Triton.
func (s *Server) RemoveModel(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.modelLocked(name).inRepo = false
}

// AddModel puts a folder for name in the repository, as an upload while the server
// runs would: it joins the index, and loads of it succeed.
func (s *Server) AddModel(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.modelLocked(name).inRepo = true
}

// HoldLoads makes loads of name wait (LOADING) until release is called (or Close).
func (s *Server) HoldLoads(name string) (release func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := make(chan struct{})
	s.modelLocked(name).holdLoad = ch
	return s.releaser(name, ch, func(m *model) *chan struct{} { return &m.holdLoad })
}

// HoldUnloads makes name stay UNLOADING after an unload until release is called (or
// Close).
func (s *Server) HoldUnloads(name string) (release func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := make(chan struct{})
	s.modelLocked(name).holdUnload = ch
	return s.releaser(name, ch, func(m *model) *chan struct{} { return &m.holdUnload })
}

func (s *Server) releaser(name string, ch chan struct{}, field func(*model) *chan struct{}) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			if f := field(s.models[name]); *f == ch {
				*f = nil
			}
			close(ch)
		})
	}
}

// State returns name's state as the index shows it; "" for a model never loaded.
func (s *Server) State(name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m := s.models[name]; m != nil {
		return m.state
	}
	return ""
}

// Loaded returns the READY models, sorted.
func (s *Server) Loaded() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for name, m := range s.models {
		if m.state == StateReady {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// LoadRequests returns how many load requests for name arrived.
func (s *Server) LoadRequests(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m := s.models[name]; m != nil {
		return m.loadRequests
	}
	return 0
}

// Loads returns how many times name was actually loaded (requests for a model already
// loaded are no-ops and do not count; preloads do).
func (s *Server) Loads(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m := s.models[name]; m != nil {
		return m.loads
	}
	return 0
}

// MaxConcurrentLoads returns the most load requests for name that were under way at
// once. Above one means the client double-loaded.
func (s *Server) MaxConcurrentLoads(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m := s.models[name]; m != nil {
		return m.maxConcurrentLoads
	}
	return 0
}

// LoadsWhileUnloading lists loads that came while a model was UNLOADING, as
// "b while a UNLOADING" ("a while a UNLOADING" for a load of the model unloading):
// loading into room not yet freed has crashed Triton.
func (s *Server) LoadsWhileUnloading() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.loadsUnderway)
}

// Events returns what happened so far, in order: "load_requested m" (any load call,
// once LoadsWhileUnloading has recorded it), "load_start m", "loaded m",
// "load_failed m", "unload_requested m" (any unload call), "unload_start m" (m went
// UNLOADING), "unloaded m", "index_unloading m" (an index read while m was UNLOADING),
// "infer m" and "live_refused" (a liveness check answered 400).
func (s *Server) Events() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.events)
}

// Subscribe returns a channel that receives every event from now on (see Events). It
// is buffered; events that do not fit are dropped from it (never from Events).
func (s *Server) Subscribe() <-chan string {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := make(chan string, 1024)
	s.subscribers = append(s.subscribers, ch)
	return ch
}

func (s *Server) eventLocked(kind, name string) {
	ev := kind
	if name != "" {
		ev += " " + name
	}
	s.events = append(s.events, ev)
	for _, ch := range s.subscribers {
		select {
		case ch <- ev:
		default:
		}
	}
}

// readRepositoryLocked puts the folders of RepositoryDir in the repository and takes
// out those it held at the last read that are gone. An unreadable folder reads as
// empty, as Triton finds no models there.
func (s *Server) readRepositoryLocked() {
	if s.cfg.RepositoryDir == "" {
		return
	}
	entries, _ := os.ReadDir(s.cfg.RepositoryDir)
	found := make(map[string]bool, len(entries))
	for _, e := range entries {
		if e.IsDir() {
			found[e.Name()] = true
		}
	}
	for name, m := range s.models {
		if m.inDir && !found[name] {
			m.inDir, m.inRepo = false, false
		}
	}
	for name := range found {
		m := s.modelLocked(name)
		m.inDir, m.inRepo = true, true
	}
}

func (s *Server) modelLocked(name string) *model {
	m := s.models[name]
	if m == nil {
		m = &model{name: name}
		s.models[name] = m
	}
	return m
}

// Embedding returns the FP32 row the fake computes for a BYTES row holding only text
// on model name, as infer answers it.
func (s *Server) Embedding(name, text string) []float32 {
	return rowValues(name, text, s.cfg.Dim)
}

// fail writes a Triton error body with code, or 400 in old-server mode.
func (s *Server) fail(w http.ResponseWriter, code int, msg string) {
	s.mu.Lock()
	old := s.oldErrors
	s.mu.Unlock()
	if old {
		code = http.StatusBadRequest
	}
	writeJSON(w, code, map[string]string{"error": msg})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		code, b = http.StatusInternalServerError, []byte(`{"error":"fake: cannot encode the answer"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(code)
	_, _ = w.Write(b)
}

// status answers an empty body with code (health and readiness endpoints).
func status(w http.ResponseWriter, ok bool) {
	w.Header().Set("Content-Length", "0")
	if ok {
		w.WriteHeader(http.StatusOK)
	} else {
		w.WriteHeader(http.StatusBadRequest)
	}
}

func (s *Server) serverMetadata(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{
		"name":    "triton",
		"version": "2.41.0-fake",
		"extensions": []string{"classification", "sequence", "model_repository", "model_repository(unload_dependents)",
			"schedule_policy", "model_configuration", "system_shared_memory", "cuda_shared_memory",
			"binary_tensor_data", "parameters", "statistics", "trace", "logging"},
	})
}

func (s *Server) healthLive(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	live := s.live
	if !live {
		s.eventLocked("live_refused", "")
	}
	s.mu.Unlock()
	status(w, live)
}

func (s *Server) healthReady(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ready := s.live
	for _, m := range s.models {
		if m.state == StateLoading || m.state == StateUnloading {
			ready = false
		}
	}
	status(w, ready)
}

// indexEntry is one row of the repository index.
type indexEntry struct {
	Name    string `json:"name"`
	Version string `json:"version,omitempty"`
	State   string `json:"state,omitempty"`
	Reason  string `json:"reason,omitempty"`
}

func (s *Server) index(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Ready bool `json:"ready"`
	}
	if b, _ := io.ReadAll(r.Body); len(bytes.TrimSpace(b)) > 0 {
		if err := json.Unmarshal(b, &req); err != nil {
			s.fail(w, http.StatusBadRequest, "failed to parse the request JSON buffer: "+err.Error())
			return
		}
	}
	s.mu.Lock()
	if s.failIndex > 0 {
		s.failIndex--
		s.mu.Unlock()
		s.fail(w, http.StatusInternalServerError, "failed to poll the model repository")
		return
	}
	s.readRepositoryLocked()
	out := []indexEntry{}
	for _, m := range s.models {
		if m.state == StateUnloading {
			s.eventLocked("index_unloading", m.name)
		}
		if !m.inRepo && (m.state == "" || m.state == StateUnavailable) {
			continue
		}
		if req.Ready && m.state != StateReady {
			continue
		}
		e := indexEntry{Name: m.name}
		if m.state != "" {
			e.Version, e.State, e.Reason = "1", m.state, m.reason
		}
		out = append(out, e)
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b indexEntry) int { return strings.Compare(a.Name, b.Name) })
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) load(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("model")
	if s.refusesModelControl() {
		s.fail(w, http.StatusServiceUnavailable, "explicit model load / unload is not allowed if polling is enabled")
		return
	}
	if b, _ := io.ReadAll(r.Body); len(bytes.TrimSpace(b)) > 0 {
		var req struct {
			Parameters map[string]any `json:"parameters"`
		}
		if err := json.Unmarshal(b, &req); err != nil {
			s.fail(w, http.StatusBadRequest, "failed to parse the request JSON buffer: "+err.Error())
			return
		}
	}

	s.mu.Lock()
	s.readRepositoryLocked()
	m := s.modelLocked(name)
	m.loadRequests++
	s.eventLocked("load_requested", name)
	// A load request counts as under way until it is answered or, once it has started
	// loading, until the load settles (which may be after the client gave up).
	m.loadsInFlight++
	m.maxConcurrentLoads = max(m.maxConcurrentLoads, m.loadsInFlight)
	settled := false
	defer func() {
		s.mu.Lock()
		if !settled {
			m.loadsInFlight--
		}
		s.mu.Unlock()
	}()
	if !m.inRepo {
		s.mu.Unlock()
		s.fail(w, http.StatusInternalServerError, fmt.Sprintf("failed to load '%s', failed to poll from model repository", name))
		return
	}
	// An unload of this model under way finishes first, but the load is recorded all
	// the same: on Triton, a load before the unload has freed the memory has crashed
	// the server, so a client must never send it.
	if m.state == StateUnloading {
		s.loadsUnderway = append(s.loadsUnderway, name+" while "+name+" UNLOADING")
	}
	for m.state == StateUnloading {
		done := m.unloadDone
		s.mu.Unlock()
		select {
		case <-done:
		case <-r.Context().Done():
			return
		}
		s.mu.Lock()
	}
	if m.state == StateReady {
		s.mu.Unlock()
		w.Header().Set("Content-Length", "0")
		w.WriteHeader(http.StatusOK)
		return
	}
	for _, other := range s.models {
		if other.state == StateUnloading {
			s.loadsUnderway = append(s.loadsUnderway, name+" while "+other.name+" UNLOADING")
		}
	}
	// A second load of a model already LOADING loads it again, as Triton has done.
	m.state, m.reason = StateLoading, ""
	m.loads++
	settled = true // the goroutine below settles it
	s.eventLocked("load_start", name)
	delay := s.cfg.LoadDelay
	if m.loadDelay != nil {
		delay = *m.loadDelay
	}
	hold := m.holdLoad
	result := make(chan error, 1)
	s.bg.Add(1)
	s.mu.Unlock()

	// The load goes on when the client gives up, as Triton's does.
	go func() {
		defer s.bg.Done()
		s.wait(delay, hold)
		s.mu.Lock()
		defer s.mu.Unlock()
		m.loadsInFlight--
		var err error
		if m.failReason != "" {
			err = fmt.Errorf("load failed for model '%s': version 1 is at UNAVAILABLE state: Internal: %s;", name, m.failReason)
			if m.state == StateLoading {
				m.state, m.reason = StateUnavailable, err.Error()
			}
			s.eventLocked("load_failed", name)
		} else {
			if m.state == StateLoading {
				m.state, m.reason = StateReady, ""
			}
			s.eventLocked("loaded", name)
		}
		if m.unloadAfterLoad && m.loadsInFlight == 0 {
			m.unloadAfterLoad = false
			if m.state == StateReady {
				s.startUnloadLocked(m)
			}
		}
		result <- err
	}()

	select {
	case err := <-result:
		if err != nil {
			s.fail(w, http.StatusBadRequest, err.Error())
			return
		}
		w.Header().Set("Content-Length", "0")
		w.WriteHeader(http.StatusOK)
	case <-r.Context().Done():
	}
}

// refusesModelControl reports whether the server is not in explicit model-control mode.
func (s *Server) refusesModelControl() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.notExplicit
}

// wait returns after d and once hold (if any) is closed, or when the server closes.
func (s *Server) wait(d time.Duration, hold chan struct{}) {
	if d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-s.closed:
		}
		t.Stop()
	}
	if hold != nil {
		select {
		case <-hold:
		case <-s.closed:
		}
	}
}

func (s *Server) unload(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("model")
	if s.refusesModelControl() {
		s.fail(w, http.StatusServiceUnavailable, "explicit model load / unload is not allowed if polling is enabled")
		return
	}
	_, _ = io.Copy(io.Discard, r.Body)
	s.mu.Lock()
	m := s.modelLocked(name)
	s.eventLocked("unload_requested", name)
	switch m.state {
	case StateReady:
		s.startUnloadLocked(m)
	case StateLoading:
		m.unloadAfterLoad = true
	}
	s.mu.Unlock()
	w.Header().Set("Content-Length", "0")
	w.WriteHeader(http.StatusOK)
}

// startUnloadLocked moves m to UNLOADING; it becomes UNAVAILABLE "unloaded" after its
// unload delay, once its hold is released and its in-flight requests have ended.
func (s *Server) startUnloadLocked(m *model) {
	m.state, m.reason = StateUnloading, ""
	m.unloadDone = make(chan struct{})
	s.eventLocked("unload_start", m.name)
	delay := s.cfg.UnloadDelay
	if m.unloadDelay != nil {
		delay = *m.unloadDelay
	}
	hold, done := m.holdUnload, m.unloadDone
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		s.wait(delay, hold)
		s.mu.Lock()
		for m.inferInFlight > 0 {
			idle := m.inferIdle
			s.mu.Unlock()
			select {
			case <-idle:
			case <-s.closed:
			}
			s.mu.Lock()
			if isClosed(s.closed) {
				break
			}
		}
		m.state, m.reason = StateUnavailable, "unloaded"
		s.eventLocked("unloaded", m.name)
		close(done)
		s.mu.Unlock()
	}()
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// versionOK answers 404 itself unless the request names no version or version 1.
func (s *Server) versionOK(w http.ResponseWriter, r *http.Request) bool {
	if v := r.PathValue("version"); v != "" && v != "1" {
		s.fail(w, http.StatusNotFound, fmt.Sprintf("Request for unknown model: '%s' version %s is not found", r.PathValue("model"), v))
		return false
	}
	return true
}

func (s *Server) modelReady(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("model")
	if v := r.PathValue("version"); v != "" && v != "1" {
		w.Header().Set("Content-Length", "0")
		w.WriteHeader(s.code(http.StatusNotFound))
		return
	}
	s.mu.Lock()
	m := s.models[name]
	code := http.StatusNotFound
	switch {
	case m == nil || m.state == "":
	case m.state == StateReady:
		code = http.StatusOK
	case m.state == StateUnavailable && m.reason == "unloaded":
	default: // LOADING, UNLOADING, a failed load: known but not ready
		code = http.StatusBadRequest
	}
	s.mu.Unlock()
	w.Header().Set("Content-Length", "0")
	w.WriteHeader(s.code(code))
}

// code maps an error status to 400 in old-server mode.
func (s *Server) code(code int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.oldErrors && code >= 300 {
		return http.StatusBadRequest
	}
	return code
}

// readyModelLocked returns name when READY, or the status and message to answer.
func (s *Server) readyModelLocked(name string) (*model, int, string) {
	m := s.models[name]
	switch {
	case m == nil || m.state == "" || (m.state == StateUnavailable && m.reason == "unloaded"):
		return nil, http.StatusNotFound, fmt.Sprintf("Request for unknown model: '%s' is not found", name)
	case m.state != StateReady:
		return nil, http.StatusServiceUnavailable, fmt.Sprintf("Request for unknown model: '%s' has no available versions", name)
	}
	return m, 0, ""
}

func (s *Server) modelMetadata(w http.ResponseWriter, r *http.Request) {
	if !s.versionOK(w, r) {
		return
	}
	name := r.PathValue("model")
	s.mu.Lock()
	_, code, msg := s.readyModelLocked(name)
	s.mu.Unlock()
	if code != 0 {
		s.fail(w, code, msg)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"name":     name,
		"versions": []string{"1"},
		"platform": "onnxruntime_onnx",
		"inputs":   []map[string]any{{"name": DefaultTextInput, "datatype": "BYTES", "shape": []int{-1, 1}}},
		"outputs":  []map[string]any{{"name": DefaultEmbeddingOutput, "datatype": "FP32", "shape": []int{-1, s.cfg.Dim}}},
	})
}

// inferRequest is the KServe v2 JSON request body.
type inferRequest struct {
	ID         string         `json:"id"`
	Parameters map[string]any `json:"parameters"`
	Inputs     []struct {
		Name       string          `json:"name"`
		Shape      []int64         `json:"shape"`
		Datatype   string          `json:"datatype"`
		Parameters map[string]any  `json:"parameters"`
		Data       json.RawMessage `json:"data"`
	} `json:"inputs"`
	Outputs []struct {
		Name       string         `json:"name"`
		Parameters map[string]any `json:"parameters"`
	} `json:"outputs"`
}

// inferOutput is one output tensor of an answer.
type inferOutput struct {
	Name     string  `json:"name"`
	Datatype string  `json:"datatype"`
	Shape    []int64 `json:"shape"`
	Data     any     `json:"data"`
}

var datatypes = map[string]bool{
	"BOOL": true, "UINT8": true, "UINT16": true, "UINT32": true, "UINT64": true,
	"INT8": true, "INT16": true, "INT32": true, "INT64": true,
	"FP16": true, "FP32": true, "FP64": true, "BF16": true, "BYTES": true,
}

func (s *Server) infer(w http.ResponseWriter, r *http.Request) {
	if !s.versionOK(w, r) {
		return
	}
	name := r.PathValue("model")
	start := time.Now()
	if r.Header.Get("Inference-Header-Content-Length") != "" {
		s.fail(w, http.StatusBadRequest, "the fake Triton does not implement the binary tensor data extension")
		return
	}
	s.mu.Lock()
	m, code, msg := s.readyModelLocked(name)
	if code != 0 {
		s.mu.Unlock()
		s.fail(w, code, msg)
		return
	}
	if m.inferInFlight == 0 {
		m.inferIdle = make(chan struct{})
	}
	m.inferInFlight++
	nested := s.nested
	s.eventLocked("infer", name)
	s.mu.Unlock()

	outputs, batch, code, msg := s.compute(name, r.Body, nested)

	s.mu.Lock()
	m.inferInFlight--
	if m.inferInFlight == 0 {
		close(m.inferIdle)
	}
	ns := uint64(time.Since(start).Nanoseconds())
	if code != 0 {
		m.failCount++
		m.failNs += ns
	} else {
		m.inferenceCount += uint64(batch)
		m.executionCount++
		m.successCount++
		m.successNs += ns
		m.lastInference = time.Now().UnixMilli()
	}
	s.mu.Unlock()
	if code != 0 {
		s.fail(w, code, msg)
		return
	}
	answer := map[string]any{"model_name": name, "model_version": "1", "outputs": outputs.outputs}
	if outputs.id != "" {
		answer["id"] = outputs.id
	}
	writeJSON(w, http.StatusOK, answer)
}

type computed struct {
	id      string
	outputs []inferOutput
}

// compute parses an infer request and produces its outputs: for each requested output
// (or DefaultEmbeddingOutput when none is named), FP32 rows of width Dim computed from
// the rows of the first input. It returns a non-zero code and a message on a bad request.
func (s *Server) compute(name string, body io.Reader, nested bool) (computed, int64, int, string) {
	var req inferRequest
	dec := json.NewDecoder(bufio.NewReader(body))
	if err := dec.Decode(&req); err != nil {
		return computed{}, 0, http.StatusBadRequest, "failed to parse the request JSON buffer: " + err.Error()
	}
	if v, _ := req.Parameters["binary_data_output"].(bool); v {
		return computed{}, 0, http.StatusBadRequest, "the fake Triton does not implement the binary tensor data extension"
	}
	if len(req.Inputs) == 0 {
		return computed{}, 0, http.StatusBadRequest, fmt.Sprintf("[request id: %s] expected at least one input for model '%s'", orUnknown(req.ID), name)
	}
	var rows []string
	var batch int64
	for i, in := range req.Inputs {
		if in.Name == "" {
			return computed{}, 0, http.StatusBadRequest, "input must have a name"
		}
		if !datatypes[in.Datatype] {
			return computed{}, 0, http.StatusBadRequest, fmt.Sprintf("invalid datatype '%s' for input '%s'", in.Datatype, in.Name)
		}
		if v, _ := in.Parameters["binary_data_size"].(float64); v > 0 {
			return computed{}, 0, http.StatusBadRequest, "the fake Triton does not implement the binary tensor data extension"
		}
		var data any
		if err := json.Unmarshal(in.Data, &data); err != nil || data == nil {
			return computed{}, 0, http.StatusBadRequest, fmt.Sprintf("expected 'data' for input '%s'", in.Name)
		}
		flat := flatten(data, nil)
		want := int64(1)
		for _, d := range in.Shape {
			if d < 0 {
				return computed{}, 0, http.StatusBadRequest, fmt.Sprintf("input '%s' has a negative dimension in shape %v", in.Name, in.Shape)
			}
			want *= d
		}
		if int64(len(flat)) != want {
			return computed{}, 0, http.StatusBadRequest, fmt.Sprintf("unexpected number of elements for input '%s': shape %v wants %d, got %d", in.Name, in.Shape, want, len(flat))
		}
		for _, e := range flat {
			_, isString := e.(string)
			if isString != (in.Datatype == "BYTES") {
				return computed{}, 0, http.StatusBadRequest, fmt.Sprintf("unable to parse 'data' of input '%s': element %v does not match datatype %s", in.Name, e, in.Datatype)
			}
		}
		if i > 0 {
			continue
		}
		batch = 1
		if len(in.Shape) > 0 {
			batch = in.Shape[0]
		}
		per := 0
		if batch > 0 {
			per = len(flat) / int(batch)
		}
		for b := range int(batch) {
			parts := make([]string, per)
			for j := range per {
				parts[j] = fmt.Sprint(flat[b*per+j])
			}
			rows = append(rows, strings.Join(parts, "\x00"))
		}
	}
	names := []string{DefaultEmbeddingOutput}
	if len(req.Outputs) > 0 {
		names = names[:0]
		for _, o := range req.Outputs {
			if v, _ := o.Parameters["binary_data"].(bool); v {
				return computed{}, 0, http.StatusBadRequest, "the fake Triton does not implement the binary tensor data extension"
			}
			names = append(names, o.Name)
		}
	}
	out := computed{id: req.ID}
	dim := s.cfg.Dim
	for _, oname := range names {
		if oname != DefaultEmbeddingOutput && oname != "OUTPUT0" {
			return computed{}, 0, http.StatusBadRequest, fmt.Sprintf("unexpected inference output '%s' for model '%s'", oname, name)
		}
		o := inferOutput{Name: oname, Datatype: "FP32", Shape: []int64{batch, int64(dim)}}
		if nested {
			data := make([][]float32, len(rows))
			for i, row := range rows {
				data[i] = rowValues(name, row, dim)
			}
			o.Data = data
		} else {
			data := make([]float32, 0, len(rows)*dim)
			for _, row := range rows {
				data = append(data, rowValues(name, row, dim)...)
			}
			o.Data = data
		}
		out.outputs = append(out.outputs, o)
	}
	return out, batch, 0, ""
}

func orUnknown(id string) string {
	if id == "" {
		return "<id_unknown>"
	}
	return id
}

// flatten lists the leaves of nested JSON arrays in row-major order.
func flatten(v any, out []any) []any {
	if a, ok := v.([]any); ok {
		for _, e := range a {
			out = flatten(e, out)
		}
		return out
	}
	return append(out, v)
}

// rowValues is the deterministic FP32 row for a row of input elements on a model:
// values in [-1, 1] drawn from an FNV hash, so every model embeds differently.
func rowValues(modelName, row string, dim int) []float32 {
	out := make([]float32, dim)
	for j := range dim {
		h := fnv.New64a()
		_, _ = h.Write([]byte(modelName))
		_, _ = h.Write([]byte{0})
		_, _ = h.Write([]byte(row))
		var idx [8]byte
		binary.LittleEndian.PutUint64(idx[:], uint64(j))
		_, _ = h.Write(idx[:])
		out[j] = float32(h.Sum64()%2001)/1000 - 1
		if math.IsNaN(float64(out[j])) {
			out[j] = 0
		}
	}
	return out
}

func (s *Server) stats(w http.ResponseWriter, r *http.Request) {
	if !s.versionOK(w, r) {
		return
	}
	name := r.PathValue("model")
	s.mu.Lock()
	m := s.models[name]
	if m == nil || m.state != StateReady {
		s.mu.Unlock()
		s.fail(w, http.StatusBadRequest, fmt.Sprintf("requested model '%s' is not available", name))
		return
	}
	zero := map[string]uint64{"count": 0, "ns": 0}
	st := map[string]any{
		"name":            name,
		"version":         "1",
		"last_inference":  m.lastInference,
		"inference_count": m.inferenceCount,
		"execution_count": m.executionCount,
		"inference_stats": map[string]any{
			"success":        map[string]uint64{"count": m.successCount, "ns": m.successNs},
			"fail":           map[string]uint64{"count": m.failCount, "ns": m.failNs},
			"queue":          zero,
			"compute_input":  zero,
			"compute_infer":  map[string]uint64{"count": m.successCount, "ns": m.successNs},
			"compute_output": zero,
			"cache_hit":      zero,
			"cache_miss":     zero,
		},
		"batch_stats":  []any{},
		"memory_usage": []any{},
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"model_stats": []any{st}})
}
