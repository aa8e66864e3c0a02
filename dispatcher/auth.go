package dispatcher

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"

	"github.com/labstack/echo/v4"

	"github.com/smartroute/smartroute/proto/credential"
	pb "github.com/smartroute/smartroute/proto/smartroutev1"
)

// Two key spaces, checked separately: worker tokens open /worker-listen only, producer
// API keys open the task endpoints (and the ops endpoints with OpsAuth) only. A leaked
// producer key cannot pose as a worker and receive other producers' tasks.

// credentials is one generation of accepted secrets. A reload builds a new one and
// swaps it in whole; requests read it without a lock.
type credentials struct {
	workers   workerTokens
	producers credential.Set
}

// authenticator checks credentials. Whether each side requires them is fixed at start
// (a token file, even an empty one, turns worker auth on); what is accepted changes on
// reload.
type authenticator struct {
	cfg          Config
	workerAuth   bool // worker tokens are required on /worker-listen
	producerAuth bool // API keys are required on the task endpoints
	cur          atomic.Pointer[credentials]
}

func newAuthenticator(cfg Config) (*authenticator, error) {
	a := &authenticator{
		cfg:          cfg,
		workerAuth:   len(cfg.WorkerTokens) > 0 || cfg.WorkerTokensFile != "",
		producerAuth: len(cfg.APIKeys) > 0 || cfg.APIKeysFile != "",
	}
	creds, err := a.load()
	if err != nil {
		return nil, err
	}
	a.cur.Store(creds)
	return a, nil
}

// load reads the configured secrets: the static ones plus the files' current content.
func (a *authenticator) load() (*credentials, error) {
	workers, err := loadWorkerTokens(a.cfg.WorkerTokens, a.cfg.WorkerTokensFile)
	if err != nil {
		return nil, err
	}
	producers, err := credential.Load("APIKeys", a.cfg.APIKeys, "APIKeysFile", a.cfg.APIKeysFile)
	if err != nil {
		return nil, err
	}
	// A secret in both sets would open both sides, and the separation above would hold
	// only on paper.
	for _, h := range producers {
		if workers.set.Holds(h) {
			return nil, fmt.Errorf("a secret is both a worker token and an API key (WorkerTokens/WorkerTokensFile and APIKeys/APIKeysFile): the two must not share secrets, so that a producer key cannot connect as a worker")
		}
	}
	return &credentials{workers: workers, producers: producers}, nil
}

// presented returns the secret a request carries: a bearer token, or for producers
// also X-API-Key. ok is false when none was sent or the header is malformed.
func presented(r *http.Request, allowAPIKeyHeader bool) (string, bool) {
	if h := r.Header.Get("Authorization"); h != "" {
		return credential.BearerToken(h)
	}
	if allowAPIKeyHeader {
		if k := r.Header.Get("X-API-Key"); k != "" {
			return k, true
		}
	}
	return "", false
}

// workerCredentialKey is where authorize leaves the worker token's hash for serveWorker.
const workerCredentialKey = "worker_credential"

// unauthorized answers 401 with a challenge; the message never echoes the secret.
func unauthorized(c echo.Context, msg string) error {
	c.Response().Header().Set("WWW-Authenticate", `Bearer realm="smartroute"`)
	return c.JSON(http.StatusUnauthorized, errorBody{msg})
}

// Refusal messages of each side.
var (
	workerRefusals = refusals{
		missing: "worker token required: send Authorization: Bearer <worker token>",
		refused: "worker token refused",
		crossed: "a producer API key cannot open /worker-listen; workers need a worker token",
	}
	producerRefusals = refusals{
		missing: "API key required: send Authorization: Bearer <api key> or X-API-Key",
		refused: "API key refused",
		crossed: "a worker token is not an API key; producers need an API key",
	}
)

type refusals struct{ missing, refused, crossed string }

// verify checks the secret a request presents against its side's set (own); a secret
// of the other side gets 403 saying so. When ok is false the answer has been written
// and err is what the handler returns.
func verify(c echo.Context, apiKeyHeader bool, own, other credential.Set, msg refusals) (h credential.Hash, ok bool, err error) {
	secret, present := presented(c.Request(), apiKeyHeader)
	if !present {
		return h, false, unauthorized(c, msg.missing)
	}
	h = credential.Sum(secret)
	switch {
	case own.Holds(h):
		return h, true, nil
	case other.Holds(h):
		return h, false, c.JSON(http.StatusForbidden, errorBody{msg.crossed})
	}
	return h, false, unauthorized(c, msg.refused)
}

// authorize is the middleware that checks credentials by route, before any handler
// runs: a refused worker is never upgraded and the hub never hears of it. Routes not
// listed (/workers, /labels, /metrics, and unknown paths) are ops routes.
func (d *Dispatcher) authorize(next echo.HandlerFunc) echo.HandlerFunc {
	a := d.auth
	return func(c echo.Context) error {
		if !a.producerAuth {
			if from := crossSite(c.Request()); from != "" {
				return c.JSON(http.StatusForbidden, errorBody{"request from a web page on another site refused (" + from +
					"): without API keys the dispatcher takes requests from programs (no Origin header) and loopback pages only; configure API keys (--api-key) for others"})
			}
		}
		var producer bool
		switch c.Path() {
		case "/health":
			return next(c)
		case "/worker-listen":
			if !a.workerAuth {
				return next(c)
			}
			creds := a.cur.Load()
			h, ok, err := verify(c, false, creds.workers.set, creds.producers, workerRefusals)
			if !ok {
				return err
			}
			// An empty or malformed id is serveWorker's 400.
			if id := c.Request().Header.Get("Worker-Id"); id != "" && !creds.workers.serves(h, id) {
				return c.JSON(http.StatusForbidden, errorBody{workerIDRefused})
			}
			c.Set(workerCredentialKey, h)
			return next(c)
		case "/run-task", "/tasks/:id", "/upload-model", "/workers/:id/drain":
			// Draining a worker changes the fleet: with API keys it needs one, whatever
			// --ops-auth says of the read-only ops routes.
			producer = true
		default:
			producer = d.cfg.OpsAuth
		}
		if !producer || !a.producerAuth {
			return next(c)
		}
		creds := a.cur.Load()
		if _, ok, err := verify(c, true, creds.producers, creds.workers.set, producerRefusals); !ok {
			return err
		}
		return next(c)
	}
}

// crossSite says where a request comes from when a web page on another site sent it
// (its Origin is not a loopback one, or the browser says Sec-Fetch-Site: cross-site),
// and "" otherwise: programs (curl, producers, agents) send neither header.
//
// authorize refuses those requests while producers need no API key (development
// mode, or worker tokens alone): any page the developer opens could otherwise drive
// the dispatcher on 127.0.0.1 with "simple" requests a browser sends without asking
// (a text/plain POST to /run-task, a drain), or with a DNS-rebound host name. With API
// keys it is not needed: a page cannot add Authorization or X-API-Key to a
// cross-origin request without a CORS preflight, which the dispatcher never grants.
func crossSite(r *http.Request) string {
	if r.Header.Get("Sec-Fetch-Site") == "cross-site" {
		return "Sec-Fetch-Site: cross-site"
	}
	if o := r.Header.Get("Origin"); o != "" && !loopbackOrigin(o) {
		return "Origin " + excerpt([]byte(o))
	}
	return ""
}

// loopbackOrigin reports whether an Origin header names a page served from this
// machine (localhost, 127.0.0.0/8, ::1). "null" (a sandboxed frame, a file) is not.
func loopbackOrigin(origin string) bool {
	u, err := url.Parse(origin)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		return false
	}
	host := u.Hostname()
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// workerIDRefused is the 403 of a worker token the tokens file binds to other ids.
const workerIDRefused = "this worker token may not connect under this Worker-Id: the worker tokens file binds it to other worker ids"

// workerRevoked says why a connected worker's token is no longer accepted for its id,
// or nil when it still is.
func (a *authenticator) workerRevoked(h credential.Hash, id string) *Disconnect {
	if !a.workerAuth {
		return nil
	}
	w := a.cur.Load().workers
	switch {
	case !w.set.Holds(h):
		return errRevoked
	case !w.serves(h, id):
		return errUnbound
	}
	return nil
}

// ReloadCredentials re-reads WorkerTokensFile and APIKeysFile (cmd/dispatcher calls it
// on SIGHUP). A removed token is revoked: new dials with it are refused, and workers
// connected with it are closed with CLOSE_CODE_UNAUTHORIZED. On an error (a file
// unreadable or malformed) the accepted secrets stay as they were.
func (d *Dispatcher) ReloadCredentials() error {
	creds, err := d.auth.load()
	if err != nil {
		d.log.Error().Err(err).Msg("credentials not reloaded; the previous ones stay in force")
		return err
	}
	// Swap first, then sweep: a worker registering concurrently either is in the hub
	// for the sweep, or checks its token against the new set after registering
	// (serveWorker), so none slips through.
	d.auth.cur.Store(creds)
	revoked := 0
	for _, wc := range d.hub.connections() {
		if why := d.auth.workerRevoked(wc.credential, wc.id); why != nil {
			wc.close(why)
			revoked++
		}
	}
	d.log.Info().Int("worker_tokens", len(creds.workers.set)).Int("worker_tokens_bound", len(creds.workers.bound)).Int("api_keys", len(creds.producers)).
		Int("workers_revoked", revoked).Msg("credentials reloaded")
	return nil
}

var (
	errRevoked = &Disconnect{Code: pb.CloseCode_CLOSE_CODE_UNAUTHORIZED, Reason: "worker token revoked"}
	errUnbound = &Disconnect{Code: pb.CloseCode_CLOSE_CODE_UNAUTHORIZED, Reason: "worker token no longer serves this worker id (worker tokens file)"}
)

// isLoopback reports whether a listen address only accepts local connections. An
// empty host means every interface; a host name other than localhost is not trusted
// to resolve to loopback.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// checkExposure refuses a non-loopback listen address unless both sides require
// credentials or InsecureNoAuth says the operator means it.
func (c Config) checkExposure() error {
	workerAuth := len(c.WorkerTokens) > 0 || c.WorkerTokensFile != ""
	producerAuth := len(c.APIKeys) > 0 || c.APIKeysFile != ""
	if workerAuth && producerAuth || c.InsecureNoAuth || isLoopback(c.Addr) {
		return nil
	}
	var open []string
	if !workerAuth {
		open = append(open, "anyone could connect as a worker (no WorkerTokens/--worker-token or WorkerTokensFile/--worker-tokens-file)")
	}
	if !producerAuth {
		open = append(open, "anyone could submit tasks (no APIKeys/--api-key or APIKeysFile/--api-keys-file)")
	}
	return fmt.Errorf("Addr %q is not a loopback address and %s; configure credentials, bind to 127.0.0.1, or pass --insecure-no-auth (InsecureNoAuth) to serve without them",
		c.Addr, strings.Join(open, " and "))
}

// logAuthMode says at start which sides run without credentials.
func (d *Dispatcher) logAuthMode() {
	a := d.auth
	switch {
	case !a.workerAuth && !a.producerAuth:
		d.log.Warn().Bool("insecure_no_auth", d.cfg.InsecureNoAuth).Msg("development mode: no worker token and no API key configured; anyone who can reach this address may submit tasks and connect as a worker")
	case !a.workerAuth:
		d.log.Warn().Msg("no worker token configured: /worker-listen accepts any worker")
	case !a.producerAuth:
		d.log.Warn().Msg("no API key configured: the task endpoints accept any producer")
	}
	if d.cfg.OpsAuth {
		d.log.Info().Msg("ops endpoints require an API key")
	}
}

// workerCredential is the token hash authorize accepted for this request.
func workerCredential(c echo.Context) credential.Hash {
	h, _ := c.Get(workerCredentialKey).(credential.Hash)
	return h
}
