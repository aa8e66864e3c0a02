package agent

import (
	"cmp"
	"context"
	"fmt"
	"sync"

	"github.com/rs/zerolog"

	"github.com/smartroute/smartroute/worker-agent/backend/triton"
)

// RunMany runs n agents in this process, named WorkerID-1 … WorkerID-n, each with its
// own connection, labels and simulated-backend seed (Sim.Seed + i). It is for load
// tests and scale runs, where thousands of agents as processes would measure the
// operating system rather than the dispatcher. It returns when all have stopped: nil
// after a drain, else the first error (which also stops the others).
func RunMany(ctx context.Context, cfg Config, n int) error {
	if n < 1 {
		return fmt.Errorf("%w: agent count must be at least 1, got %d", ErrConfig, n)
	}
	if n > 1 && (cfg.BackendName == triton.Name || cfg.Backend != nil) {
		// Each agent believes it owns its backend: agents sharing one Triton would adopt
		// the same models, fill MaxLabels each, and unload models the others run tasks on.
		return fmt.Errorf("%w: %d agents cannot share one backend (%s); run one agent per Triton", ErrConfig, n, cmp.Or(cfg.BackendName, "injected"))
	}
	if cfg.MetricsAddr != "" {
		if cfg.Metrics == nil {
			cfg.Metrics = NewMetrics()
		}
		stop, addr, err := serveOps(cfg.MetricsAddr, cfg.Metrics, cfg.Pprof)
		if err != nil {
			return err
		}
		defer stop()
		// The bound address, so that --metrics-addr :0 (tests, several agents on one
		// host) can be found.
		d := cfg.WithDefaults()
		if lvl, err := zerolog.ParseLevel(d.LogLevel); err == nil {
			log := zerolog.New(d.LogOutput).Level(lvl).With().Timestamp().Str("worker_id", d.WorkerID).Logger()
			log.Info().Str("addr", addr).Bool("pprof", cfg.Pprof).Msg("agent ops endpoints listening")
		}
	}
	if n == 1 {
		return Run(ctx, cfg)
	}
	cfg = cfg.WithDefaults() // one default worker id to suffix
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	for i := 1; i <= n; i++ {
		c := cfg
		c.WorkerID = fmt.Sprintf("%s-%d", cfg.WorkerID, i)
		c.Sim.WorkerID = ""
		c.Sim.Seed = cfg.Sim.Seed + int64(i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := Run(ctx, c); err != nil {
				once.Do(func() { first = err; cancel() })
			}
		}()
	}
	wg.Wait()
	return first
}
