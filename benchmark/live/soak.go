package live

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/smartroute/smartroute/benchmark/producer"
)

// SoakConfig configures Soak. The cluster comes from Config (workers, labels, the
// simulated backend, binaries); the load is Soak's own: open loop at a fixed rate.
type SoakConfig struct {
	Config
	// Duration of the run at Rate. Zero means 5m.
	Duration time.Duration
	// Rate is the tasks per second sent. Zero means 80% of the capacity measured by a
	// closed-loop probe of ProbeDuration first.
	Rate float64
	// ProbeDuration bounds the capacity probe. Zero means 10s.
	ProbeDuration time.Duration
	// Concurrency bounds the requests in flight (the probe's producers, and the open
	// loop's ceiling). Zero means 64.
	Concurrency int
	// Retention is the dispatcher's --task-retention. Answers kept for GET /tasks are
	// rate × retention records (about 1 KiB each), whose number follows the achieved
	// rate of the last retention window; a long retention makes the memory check
	// measure the producer's jitter instead of growth. Zero means 1s.
	Retention time.Duration
	// MaxGrowth is how much the dispatcher's memory may change between the end of
	// the warm-up and the end of the run. Zero means 0.10.
	MaxGrowth float64
}

func (c SoakConfig) withDefaults() SoakConfig {
	c.Config = c.Config.withDefaults()
	if c.Duration == 0 {
		c.Duration = 5 * time.Minute
	}
	if c.ProbeDuration == 0 {
		c.ProbeDuration = 10 * time.Second
	}
	if c.Concurrency == 0 {
		c.Concurrency = 64
	}
	if c.Retention == 0 {
		c.Retention = time.Second
	}
	if c.MaxGrowth == 0 {
		c.MaxGrowth = 0.10
	}
	return c
}

// SoakResult is what a soak measured.
type SoakResult struct {
	Capacity      float64 // tasks/s the probe measured; 0 when Rate was given
	Concurrency   int
	Rate          float64 // target tasks/s
	Achieved      float64 // tasks/s answered during the run
	Duration      time.Duration
	Sent, OK      int64
	Errors        int64
	FirstError    string
	Latency       producer.LatencyStats
	HeapStart     uint64 // dispatcher heap in use after a GC, end of warm-up
	HeapEnd       uint64
	RSSStart      uint64 // dispatcher resident set, end of warm-up
	RSSEnd        uint64
	Samples       []memSample // from the end of the warm-up to the end
	MaxGrowth     float64
	WarmUp        time.Duration
	DispatcherPID int
	// EarlyExits say which processes ended by themselves before the stop: an agent
	// lost during the soak changes what was measured without an error to show for it.
	EarlyExits []string
}

// soakSamples is how many times memory is sampled after the warm-up.
const soakSamples = 10

// memSample is the dispatcher's memory at one moment.
type memSample struct{ Heap, RSS uint64 }

// medianOf returns the median heap and the median RSS of samples (not empty).
func medianOf(samples []memSample) (heap, rss uint64) {
	hs := make([]uint64, len(samples))
	rs := make([]uint64, len(samples))
	for i, m := range samples {
		hs[i], rs[i] = m.Heap, m.RSS
	}
	slices.Sort(hs)
	slices.Sort(rs)
	return hs[len(hs)/2], rs[len(rs)/2]
}

// HeapGrowth and RSSGrowth are the relative change from start to end.
func (r SoakResult) HeapGrowth() float64 { return growth(r.HeapStart, r.HeapEnd) }
func (r SoakResult) RSSGrowth() float64  { return growth(r.RSSStart, r.RSSEnd) }

func growth(a, b uint64) float64 {
	if a == 0 {
		return 0
	}
	return float64(b)/float64(a) - 1
}

// Failures lists the targets the run missed: any error, memory not flat.
func (r SoakResult) Failures() []string {
	var out []string
	if r.Errors > 0 {
		out = append(out, fmt.Sprintf("%d errors (first: %s)", r.Errors, r.FirstError))
	}
	out = append(out, r.EarlyExits...)
	if g := r.HeapGrowth(); g > r.MaxGrowth || g < -r.MaxGrowth {
		out = append(out, fmt.Sprintf("heap changed %+.1f%% (limit ±%.0f%%)", 100*g, 100*r.MaxGrowth))
	}
	if g := r.RSSGrowth(); g > r.MaxGrowth || g < -r.MaxGrowth {
		out = append(out, fmt.Sprintf("RSS changed %+.1f%% (limit ±%.0f%%)", 100*g, 100*r.MaxGrowth))
	}
	return out
}

// Write prints the result as text.
func (r SoakResult) Write(w io.Writer) {
	if r.Capacity > 0 {
		fmt.Fprintf(w, "capacity      %.0f tasks/s (closed loop, %d in flight)\n", r.Capacity, r.Concurrency)
	}
	fmt.Fprintf(w, "rate          %.0f tasks/s target, %.0f achieved, for %v\n", r.Rate, r.Achieved, r.Duration.Round(time.Second))
	fmt.Fprintf(w, "tasks         %d sent, %d ok, %d errors\n", r.Sent, r.OK, r.Errors)
	fmt.Fprintf(w, "latency       p50 %.1f ms, p99 %.1f ms, max %.1f ms\n", ms(r.Latency.P50), ms(r.Latency.P99), ms(r.Latency.Max))
	fmt.Fprintf(w, "heap (GC'd)   %.1f MiB after the %v warm-up, %.1f MiB at the end (%+.1f%%; medians of 3 samples)\n", mib(r.HeapStart), r.WarmUp, mib(r.HeapEnd), 100*r.HeapGrowth())
	fmt.Fprintf(w, "RSS           %.1f MiB after the %v warm-up, %.1f MiB at the end (%+.1f%%)\n", mib(r.RSSStart), r.WarmUp, mib(r.RSSEnd), 100*r.RSSGrowth())
	var heaps, rsss []string
	for _, m := range r.Samples {
		heaps = append(heaps, fmt.Sprintf("%.1f", mib(m.Heap)))
		rsss = append(rsss, fmt.Sprintf("%.1f", mib(m.RSS)))
	}
	fmt.Fprintf(w, "samples (MiB) heap %s\n              RSS  %s\n", strings.Join(heaps, " "), strings.Join(rsss, " "))
	if f := r.Failures(); len(f) > 0 {
		fmt.Fprintf(w, "FAIL          %s\n", strings.Join(f, "; "))
	} else {
		fmt.Fprintln(w, "PASS          no errors, memory flat")
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
func mib(b uint64) float64       { return float64(b) / (1 << 20) }

// Soak starts a cluster, measures its capacity (unless Rate is set), runs at 80% of
// it for Duration and reports errors and the dispatcher's memory. It returns an error
// only when the run could not be made; missed targets are in the result's Failures.
func Soak(ctx context.Context, cfg SoakConfig) (SoakResult, error) {
	cfg = cfg.withDefaults()
	res := SoakResult{MaxGrowth: cfg.MaxGrowth, Concurrency: cfg.Concurrency}
	bins, cleanup, err := resolveBinaries(ctx, cfg.Config)
	if err != nil {
		return res, err
	}
	defer cleanup()
	outDir := cfg.OutDir
	if outDir == "" {
		if outDir, err = os.MkdirTemp("", "smartroute-soak-"); err != nil {
			return res, err
		}
	}
	dir := filepath.Join(outDir, "soak")
	if err := freshDir(dir); err != nil { // else an earlier soak's journal is replayed
		return res, err
	}
	pprofAddr, err := freeLoopbackAddr()
	if err != nil {
		return res, err
	}
	c, err := startCluster(ctx, clusterSpec{bins: bins, dir: dir, cfg: cfg.Config, dispatcherArgs: []string{
		"--pprof-addr", pprofAddr, "--task-retention", cfg.Retention.String()}})
	if err != nil {
		return res, err
	}
	defer c.stop()
	res.DispatcherPID = c.dispatcher.pid()
	// IdleConnTimeout below the dispatcher's --idle-timeout: the client closes first.
	client := &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: cfg.Concurrency,
		IdleConnTimeout: 90 * time.Second, DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext}}
	defer client.CloseIdleConnections()
	l := &soakLoad{cfg: cfg, client: client, url: c.baseURL + "/run-task"}

	res.Rate = cfg.Rate
	if res.Rate == 0 {
		cfg.Logger.Info().Dur("probe", cfg.ProbeDuration).Msg("measuring capacity")
		res.Capacity = l.probe(ctx)
		if res.Capacity == 0 {
			return res, fmt.Errorf("capacity probe completed no task (first error: %s)", l.firstErr())
		}
		res.Rate = 0.8 * res.Capacity
		l.reset()
	}
	res.WarmUp = min(30*time.Second, cfg.Duration/5)
	cfg.Logger.Info().Float64("rate", res.Rate).Dur("duration", cfg.Duration).Dur("warm_up", res.WarmUp).Msg("soak running")
	sample := func() (memSample, error) {
		heap, err := heapInUse(ctx, client, "http://"+pprofAddr)
		if err != nil {
			return memSample{}, err
		}
		rss, err := residentBytes(res.DispatcherPID)
		return memSample{heap, rss}, err
	}
	// Memory is sampled soakSamples times from the end of the warm-up on; start and
	// end are the medians of the first and last three samples, so that one sample
	// caught with a burst of requests in flight does not decide the verdict.
	var samples []memSample
	var sampleErr error
	sampled := make(chan struct{})
	runCtx, stopSampling := context.WithCancel(ctx)
	go func() {
		defer close(sampled)
		every := (cfg.Duration - res.WarmUp) / soakSamples
		next := time.NewTimer(res.WarmUp)
		defer next.Stop()
		for len(samples) < soakSamples {
			select {
			case <-runCtx.Done():
				return
			case <-next.C:
			}
			m, err := sample()
			if err != nil {
				sampleErr = err
				return
			}
			samples = append(samples, m)
			next.Reset(every)
		}
	}()
	start := time.Now()
	latencies := l.openLoop(ctx, res.Rate, cfg.Duration)
	res.Duration = time.Since(start)
	stopSampling()
	<-sampled
	if ctx.Err() != nil {
		return res, ctx.Err()
	}
	if sampleErr != nil {
		return res, fmt.Errorf("dispatcher memory: %w", sampleErr)
	}
	last, err := sample()
	if err != nil {
		return res, fmt.Errorf("dispatcher memory: %w", err)
	}
	samples = append(samples, last)
	res.Samples = samples
	res.HeapStart, res.RSSStart = medianOf(samples[:min(3, len(samples))])
	res.HeapEnd, res.RSSEnd = medianOf(samples[max(0, len(samples)-3):])
	res.Sent, res.OK, res.Errors = l.sent.Load(), l.ok.Load(), l.errors.Load()
	res.FirstError = l.firstErr()
	res.Achieved = float64(res.OK) / res.Duration.Seconds()
	res.Latency = producer.Latencies(latencies)
	c.stop() // the deferred call is then a no-op
	for _, err := range c.earlyExits() {
		res.EarlyExits = append(res.EarlyExits, err.Error())
	}
	return res, nil
}

// soakLoad sends tasks and counts their answers.
type soakLoad struct {
	cfg    SoakConfig
	client *http.Client
	url    string
	seq    atomic.Int64

	sent, ok, errors atomic.Int64
	errMu            sync.Mutex
	firstError       string

	// sendingStopped, when set, is called once openLoop sends no more, before it
	// waits for the tasks in flight. For tests.
	sendingStopped func()
}

func (l *soakLoad) reset() {
	l.sent.Store(0)
	l.ok.Store(0)
	l.errors.Store(0)
	l.errMu.Lock()
	l.firstError = ""
	l.errMu.Unlock()
}

func (l *soakLoad) firstErr() string {
	l.errMu.Lock()
	defer l.errMu.Unlock()
	return l.firstError
}

// send runs one synchronous task and returns its latency; false when it failed.
func (l *soakLoad) send(ctx context.Context) (time.Duration, bool) {
	n := l.seq.Add(1)
	label := "label-" + strconv.FormatInt(1+n%int64(max(l.cfg.Labels, 1)), 10)
	body := fmt.Sprintf(`{"task_id":"soak-%d","task_type":"sample_task","label":%q,"parameters_json":"{}"}`, n, label)
	l.sent.Add(1)
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.url, strings.NewReader(body))
	if err != nil {
		l.fail(err.Error())
		return 0, false
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := l.client.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			l.fail(err.Error())
		}
		return 0, false
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		l.fail(fmt.Sprintf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(b))))
		return 0, false
	}
	l.ok.Add(1)
	return time.Since(start), true
}

func (l *soakLoad) fail(msg string) {
	l.errors.Add(1)
	l.errMu.Lock()
	if l.firstError == "" {
		l.firstError = msg
	}
	l.errMu.Unlock()
}

// probe runs Concurrency closed-loop producers for ProbeDuration and returns the
// answered tasks per second.
func (l *soakLoad) probe(ctx context.Context) float64 {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.ProbeDuration)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	for range l.cfg.Concurrency {
		wg.Go(func() {
			for ctx.Err() == nil {
				l.send(ctx)
			}
		})
	}
	wg.Wait()
	return float64(l.ok.Load()) / time.Since(start).Seconds()
}

// openLoop sends rate tasks per second for d, each on its own goroutine, at most
// Concurrency in flight (beyond that the sender waits, and the achieved rate shows
// it), and returns the latencies of the answered tasks. The end of d stops the sending
// only: the tasks in flight are answered. The end of ctx (Ctrl-C) ends them too, or
// an interrupted soak would wait for each sync request, as long as the dispatcher
// holds it (its --task-timeout, 5 minutes by default).
func (l *soakLoad) openLoop(parent context.Context, rate float64, d time.Duration) []time.Duration {
	ctx, cancel := context.WithTimeout(parent, d)
	defer cancel()
	sem := make(chan struct{}, l.cfg.Concurrency)
	var mu sync.Mutex
	latencies := make([]time.Duration, 0, int(rate*d.Seconds())+1)
	var wg sync.WaitGroup
	const tick = 10 * time.Millisecond
	t := time.NewTicker(tick)
	defer t.Stop()
	start, due := time.Now(), 0.0
	sentCount := 0
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		due = rate * time.Since(start).Seconds()
		for float64(sentCount) < due && ctx.Err() == nil {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				continue
			}
			sentCount++
			wg.Go(func() {
				defer func() { <-sem }()
				if lat, ok := l.send(parent); ok {
					mu.Lock()
					latencies = append(latencies, lat)
					mu.Unlock()
				}
			})
		}
	}
	if l.sendingStopped != nil {
		l.sendingStopped()
	}
	wg.Wait()
	return latencies
}

// heapInUse reads the dispatcher's heap in use after a GC from its pprof endpoint.
func heapInUse(ctx context.Context, client *http.Client, base string) (uint64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/debug/pprof/heap?gc=1&debug=1", nil)
	if err != nil {
		return 0, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	return memStat(resp.Body, "HeapInuse")
}

// memStat finds "# name = value" in a pprof heap profile in text form.
func memStat(r io.Reader, name string) (uint64, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	prefix := "# " + name + " = "
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), prefix); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no %q in the heap profile", name)
}

// residentBytes reads a process's resident set size from /proc (Linux only).
func residentBytes(pid int) (uint64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("RSS: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("RSS: no VmRSS in /proc status")
}
