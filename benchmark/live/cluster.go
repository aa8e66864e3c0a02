package live

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/smartroute/smartroute/dispatcher/scheduler"
)

// cluster is a dispatcher and its worker agents running on loopback.
type cluster struct {
	log        zerolog.Logger
	baseURL    string // http://127.0.0.1:<port>
	dispatcher *process
	agents     []*process
	// backends are the fake Tritons beside the agents (--backend triton), one each.
	backends []*process
	// collector receives the agents' logs; the summary is read from its files.
	collector    *process
	collectorDir string
	stopGrace    time.Duration
	stopOnce     sync.Once
	stopErr      error
}

// clusterSpec is what startCluster needs; it is derived from a Config and a mode.
type clusterSpec struct {
	bins           binaries
	dir            string // logs go here
	random         bool
	cfg            Config
	onProcessStart func(*process)
	// dispatcherArgs are passed to the dispatcher after the usual ones (the soak's).
	dispatcherArgs []string
}

// pollInterval is how often readiness is checked.
const pollInterval = 25 * time.Millisecond

// portAttempts bounds the retries when the port picked for the dispatcher is taken
// between picking and binding.
const portAttempts = 3

// agentID names worker i (from 1).
func agentID(i int) string { return fmt.Sprintf("bench-worker-%d", i) }

// scaled multiplies d by the time scale.
func scaled(d time.Duration, scale float64) time.Duration {
	return time.Duration(float64(d) * scale)
}

// dispatcherArgs are the dispatcher's flags: its journal goes under dir (never the
// working directory), and extra come last.
//
// The scheduler's own durations are scaled with the workload's: its load and run time
// priors and its pass-over floor go to the dispatcher as their defaults times the
// scale, so that a scaled run makes the decisions a run at scale 1 would. Left at their
// defaults, at seed-4's scale of 0.05 they told the scheduler that a label not yet
// loaded (or forgotten with its last copy) takes 400 ms to load, 20 times what it
// takes: a holder busy loading one looked 450 ms from free, so a task for its other
// label loaded that label on the other worker, evicting a label the next task missed
// (2 extra misses at the start of both runs traced). At the smallest scale, 1e-6, none
// rounds to 0, which the dispatcher refuses. --max-delay-slack is not scaled: it bounds
// delays outside the tasks (the host, the network), which the scale does not shrink.
func dispatcherArgs(cfg Config, addr string, random bool, dir string, extra []string) []string {
	sched := scheduler.Config{}.WithDefaults()
	args := []string{
		"--addr", addr,
		"--random-dispatch=" + strconv.FormatBool(random),
		"--log-level", cfg.LogLevel,
		"--data-dir", filepath.Join(dir, "dispatcher-data"),
		"--load-time-prior", scaled(sched.LoadTimePrior, cfg.TimeScale).String(),
		"--run-time-prior", scaled(sched.RunTimePrior, cfg.TimeScale).String(),
		"--max-pass-over", scaled(sched.MaxPassOver, cfg.TimeScale).String(),
	}
	if cfg.TaskTimeout > 0 {
		args = append(args, "--task-timeout", cfg.TaskTimeout.String())
	}
	return append(args, extra...)
}

// agentArgs are agent i's flags; tritonURL is its Triton's with BackendTriton.
func agentArgs(cfg Config, addr string, i int, tritonURL string) []string {
	s := cfg.TimeScale
	args := []string{
		"--dispatcher-url", "ws://" + addr + "/worker-listen",
		"--worker-id", agentID(i),
		"--max-labels", strconv.Itoa(cfg.MaxLabels),
		"--slots", strconv.Itoa(cfg.Slots),
		"--log-level", agentLogLevel(cfg.LogLevel),
	}
	if cfg.Backend == BackendTriton {
		return append(args, "--backend", "triton", "--triton-url", tritonURL)
	}
	return append(args,
		"--backend", "sim",
		"--sim-load-time", scaled(cfg.SimLoadTime, s).String(),
		"--sim-load-jitter", scaled(cfg.SimLoadJitter, s).String(),
		"--sim-run-time", scaled(cfg.SimRunTime, s).String(),
		"--sim-run-jitter", scaled(cfg.SimRunJitter, s).String(),
		"--seed", strconv.FormatInt(cfg.Seed+int64(i), 10),
	)
}

// fakeTritonArgs serve every benchmark label as a model whose load takes the
// time-scaled SimLoadTime, as a real model's load would.
func fakeTritonArgs(cfg Config, addr string) []string {
	models := make([]string, cfg.Labels)
	for i := range models {
		models[i] = fmt.Sprintf("label-%d", i+1)
	}
	return []string{
		"--addr", addr,
		"--models", strings.Join(models, ","),
		"--load-delay", scaled(cfg.SimLoadTime, cfg.TimeScale).String(),
		"--unload-delay", scaled(cfg.SimLoadTime/8, cfg.TimeScale).String(),
	}
}

// agentLogLevel is cfg.LogLevel, but never quieter than info: the agents' task
// records, which the summary reads, are logged at info.
func agentLogLevel(level string) string {
	if l, err := zerolog.ParseLevel(level); err == nil && l <= zerolog.DebugLevel {
		return "debug"
	}
	return "info"
}

// startCluster starts the dispatcher, waits for its health, starts the agents and
// waits until all are connected. On error, everything started is stopped.
func startCluster(ctx context.Context, spec clusterSpec) (_ *cluster, err error) {
	cfg := spec.cfg
	c := &cluster{log: cfg.Logger, stopGrace: cfg.StopTimeout}
	defer func() {
		if err != nil {
			if stopErr := c.stop(); stopErr != nil {
				err = errors.Join(err, stopErr)
			}
		}
	}()
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{Proxy: nil}}
	defer client.CloseIdleConnections()
	env := childEnv()
	started := func(p *process) {
		if spec.onProcessStart != nil {
			spec.onProcessStart(p)
		}
	}

	// startServer starts a server on a free loopback port and waits for its /health,
	// into *slot so that stop ends it whatever happens. The port is found free and then
	// given to the process, so another can take it in between: a process that exits
	// saying so is started again on another port.
	startServer := func(slot **process, name, bin string, args func(addr string) []string) (string, error) {
		for attempt := 1; ; attempt++ {
			addr, err := freeLoopbackAddr()
			if err != nil {
				return "", err
			}
			p, err := startProcess(name, bin, args(addr), env, spec.dir)
			if err != nil {
				return "", err
			}
			*slot = p
			started(p)
			err = waitUntil(ctx, cfg.ReadyTimeout, []*process{p}, func(ctx context.Context) error {
				return checkHealth(ctx, client, "http://"+addr)
			})
			if err == nil {
				return addr, nil
			}
			if attempt < portAttempts && p.exited() && strings.Contains(tailLines(p.stderrPath, 50)+tailLines(p.stdoutPath, 50), "address already in use") {
				c.log.Warn().Str("addr", addr).Msg(name + " port taken; trying another")
				if err := p.stop(c.stopGrace); err != nil {
					return "", err
				}
				continue
			}
			return "", fmt.Errorf("waiting for the %s's /health: %w", name, err)
		}
	}

	// The log collector first: the agents stream their records to it from the start.
	c.collectorDir = filepath.Join(spec.dir, "collector")
	collectorAddr, err := startServer(&c.collector, "log-collector", spec.bins.collector, func(addr string) []string {
		return []string{"--addr", addr, "--dir", c.collectorDir, "--log-level", "warn"}
	})
	if err != nil {
		return c, err
	}
	addr, err := startServer(&c.dispatcher, "dispatcher", spec.bins.dispatcher, func(addr string) []string {
		return dispatcherArgs(cfg, addr, spec.random, spec.dir, spec.dispatcherArgs)
	})
	if err != nil {
		return c, err
	}
	c.baseURL = "http://" + addr
	c.log.Info().Str("addr", addr).Bool("random_dispatch", spec.random).Int("pid", c.dispatcher.pid()).Msg("dispatcher started")

	want := make([]string, cfg.NumWorkers)
	for i := range cfg.NumWorkers {
		want[i] = agentID(i + 1)
		var tritonURL string
		if cfg.Backend == BackendTriton {
			// The agent waits for its Triton to be live before it says hello, so the
			// workers' readiness below covers the fakes too.
			tritonAddr, err := freeLoopbackAddr()
			if err != nil {
				return c, err
			}
			fake, err := startProcess("fake-triton-"+strconv.Itoa(i+1), spec.bins.fakeTriton, fakeTritonArgs(cfg, tritonAddr), env, spec.dir)
			if err != nil {
				return c, err
			}
			c.backends = append(c.backends, fake)
			started(fake)
			tritonURL = "http://" + tritonAddr
		}
		args := append(agentArgs(cfg, addr, i+1, tritonURL), "--log-collector-url", "ws://"+collectorAddr+"/ingest")
		p, err := startProcess(want[i], spec.bins.agent, args, env, spec.dir)
		if err != nil {
			return c, err
		}
		c.agents = append(c.agents, p)
		started(p)
	}
	err = waitUntil(ctx, cfg.ReadyTimeout, c.all(), func(ctx context.Context) error {
		return checkWorkers(ctx, client, c.baseURL, want)
	})
	if err != nil {
		return c, fmt.Errorf("waiting for %d workers to connect: %w", cfg.NumWorkers, err)
	}
	c.log.Info().Int("workers", cfg.NumWorkers).Msg("workers connected")
	return c, nil
}

// all is every process of the cluster: agents, fake Tritons, dispatcher, collector.
func (c *cluster) all() []*process {
	ps := append(slices.Clone(c.agents), c.backends...)
	if c.dispatcher != nil {
		ps = append(ps, c.dispatcher)
	}
	if c.collector != nil {
		ps = append(ps, c.collector)
	}
	return ps
}

// agentLogs are the paths of the agents' logs as the log collector stored them (the
// agents' stdout is kept beside, for reading by hand).
func (c *cluster) agentLogs() ([]string, error) {
	paths, err := filepath.Glob(filepath.Join(c.collectorDir, "*", "*.jsonl"))
	if err != nil {
		return nil, err
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("the log collector holds no worker logs in %s", c.collectorDir)
	}
	return paths, nil
}

// stop ends the agents, all at once, then the dispatcher, so that no agent is left
// reconnecting to a dispatcher that is gone. Its error says which processes had to be
// killed and which had ended by themselves before (earlyExits). Idempotent.
func (c *cluster) stop() error {
	c.stopOnce.Do(func() {
		errs := make([]error, len(c.agents))
		var wg sync.WaitGroup
		for i, a := range c.agents {
			wg.Go(func() { errs[i] = a.stop(c.stopGrace) })
		}
		wg.Wait()
		// A draining agent may still call its Triton: the fakes go after the agents.
		for _, b := range c.backends {
			errs = append(errs, b.stop(c.stopGrace))
		}
		if c.dispatcher != nil {
			errs = append(errs, c.dispatcher.stop(c.stopGrace))
		}
		// The collector goes last: a draining agent ships its final records first.
		if c.collector != nil {
			errs = append(errs, c.collector.stop(c.stopGrace))
		}
		// A process that died during the run stops "cleanly": said here, or a crashed
		// log collector would leave the summary to be read from partial logs unnoticed.
		errs = append(errs, c.earlyExits()...)
		c.stopErr = errors.Join(errs...)
		if c.stopErr != nil {
			c.log.Warn().Err(c.stopErr).Msg("cluster stopped uncleanly")
		} else if len(c.all()) > 0 {
			c.log.Info().Msg("cluster stopped")
		}
	})
	return c.stopErr
}

// earlyExits are the errors of the processes that had ended by themselves before the
// stop, in the order of all. Valid once stop has returned.
func (c *cluster) earlyExits() []error {
	var errs []error
	for _, p := range c.all() {
		if err := p.earlyExit(); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// freeLoopbackAddr picks a free TCP port on 127.0.0.1. Another process may take it
// before the dispatcher binds it; startCluster retries then.
func freeLoopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("picking a port for the dispatcher: %w", err)
	}
	addr := l.Addr().String()
	return addr, l.Close()
}

// waitUntil calls check every pollInterval until it returns nil, timeout passes, ctx
// ends, or one of procs exits.
func waitUntil(ctx context.Context, timeout time.Duration, procs []*process, check func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	var lastErr error // the last failed check that was not cut short by ctx
	for {
		err := check(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() == nil || lastErr == nil {
			lastErr = err
		}
		for _, p := range procs {
			if p.exited() {
				return errors.New(p.describeExit())
			}
		}
		select {
		case <-ctx.Done():
			if context.Cause(ctx) == context.DeadlineExceeded {
				return fmt.Errorf("not ready after %v; last check: %w", timeout, lastErr)
			}
			return ctx.Err()
		case <-t.C:
		}
	}
}

func getJSON(ctx context.Context, client *http.Client, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: HTTP %d", url, resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	return nil
}

// checkHealth succeeds when GET /health answers 200 {"message":"OK"}.
func checkHealth(ctx context.Context, client *http.Client, baseURL string) error {
	var body struct {
		Message string `json:"message"`
	}
	if err := getJSON(ctx, client, baseURL+"/health", &body); err != nil {
		return err
	}
	if body.Message != "OK" {
		return fmt.Errorf("GET /health: message %q, want \"OK\"", body.Message)
	}
	return nil
}

// checkWorkers succeeds when GET /workers lists every id in want.
func checkWorkers(ctx context.Context, client *http.Client, baseURL string, want []string) error {
	var body struct {
		Workers []string `json:"workers"`
	}
	if err := getJSON(ctx, client, baseURL+"/workers", &body); err != nil {
		return err
	}
	var missing []string
	for _, id := range want {
		if !slices.Contains(body.Workers, id) {
			missing = append(missing, id)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("GET /workers lists %v; not yet %v", body.Workers, missing)
	}
	return nil
}

// openLogs opens the files at paths for reading; the caller closes them.
func openLogs(paths []string) ([]*os.File, error) {
	var files []*os.File
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			for _, f := range files {
				f.Close()
			}
			return nil, err
		}
		files = append(files, f)
	}
	return files, nil
}

// freshDir empties dir for one run, creating it if need be. The log collector appends to
// the files it finds and the dispatcher reruns the journal it finds, so an earlier
// run's records left in a reused --out would be counted in this one.
func freshDir(dir string) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	return os.MkdirAll(dir, 0o755)
}
