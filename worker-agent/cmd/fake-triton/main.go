// Command fake-triton serves a stand-in for Triton Inference Server's HTTP API, because
// Triton cannot run on our machines. It follows the facts in shared/TRITON.md (explicit
// model control, blocking loads, asynchronous unloads with a visible UNLOADING state,
// the repository index, {"error": ...} bodies, infer with deterministic FP32 outputs,
// statistics): see package worker-agent/backend/triton/fake. Point an agent at it with
// --backend triton --triton-url http://<addr>. Against a real Triton, run Triton itself
// instead (README, "Running beside Triton").
//
// Flags:
//
//	--addr          127.0.0.1:8000   listen address (Triton's HTTP port)
//	--models        model-a,model-b  comma-separated model folders in the repository (none by default with --repository)
//	--repository    none             a model repository on disk: each folder in it is a model too, read at every index and load (add one while it runs to upload a model)
//	--load-model    none             comma-separated models loaded at start (Triton's --load-model)
//	--load-delay    400ms            how long each load blocks
//	--unload-delay  100ms            how long an unloaded model stays UNLOADING
//	--fail-models   none             comma-separated models whose loads fail (400 "load failed for model ...")
//	--old-errors    false            answer 400 for every error, as servers before late 2023 do
//	--dim           8                width of the FP32 output rows
//
// SIGINT or SIGTERM stops it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/smartroute/smartroute/worker-agent/backend/triton/fake"
)

func main() {
	var (
		addr, models, preload, failing string
		cfg                            fake.Config
	)
	flag.StringVar(&addr, "addr", "127.0.0.1:8000", "listen address")
	flag.StringVar(&models, "models", "model-a,model-b", "comma-separated model folders in the repository (none by default with --repository)")
	flag.StringVar(&cfg.RepositoryDir, "repository", "", "a model repository on disk: each folder in it is a model too, read at every index and load")
	flag.StringVar(&preload, "load-model", "", "comma-separated models loaded at start")
	flag.DurationVar(&cfg.LoadDelay, "load-delay", 400*time.Millisecond, "how long each load blocks")
	flag.DurationVar(&cfg.UnloadDelay, "unload-delay", 100*time.Millisecond, "how long an unloaded model stays UNLOADING")
	flag.StringVar(&failing, "fail-models", "", "comma-separated models whose loads fail")
	flag.BoolVar(&cfg.OldErrors, "old-errors", false, "answer 400 for every error (servers before late 2023)")
	flag.IntVar(&cfg.Dim, "dim", fake.DefaultDim, "width of the FP32 output rows")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "fake-triton: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	modelsGiven := false
	flag.Visit(func(f *flag.Flag) { modelsGiven = modelsGiven || f.Name == "models" })
	if cfg.RepositoryDir != "" && !modelsGiven {
		models = "" // the repository's folders are the models
	}
	cfg.Models, cfg.Preload = split(models), split(preload)
	f := fake.New(cfg)
	for _, m := range split(failing) {
		f.FailLoads(m, "failing on purpose (--fail-models)")
	}

	srv := &http.Server{Addr: addr, Handler: f, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		f.Close()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		log.Fatalf("fake-triton: %v", err)
	}
	// The bound address, so that --addr 127.0.0.1:0 can be used: the e2e tests read it.
	log.Printf("fake-triton (a stand-in for Triton) serving on %s, models %q", ln.Addr(), cfg.Models)
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Fatalf("fake-triton: %v", err)
	}
}

func split(s string) []string {
	var out []string
	for p := range strings.SplitSeq(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
