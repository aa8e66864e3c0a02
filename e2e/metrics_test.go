package e2e

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// scrape returns the status and body of an ops endpoint.
func scrape(url string) (int, string) {
	resp, err := http.Get(url)
	if err != nil {
		return -1, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The real binaries serve their metrics: the dispatcher on its port, two agents of one
// process on --metrics-addr with their probes and pprof, and the counts match the tasks
// run.
func TestMetricsFromRealProcesses(t *testing.T) {
	t.Parallel()
	s := startStack(t, stackOpts{workers: 0, loadTime: time.Millisecond, runTime: time.Millisecond})
	agents := start(t, "worker-agent#metrics", "--dispatcher-url", "ws://"+s.addr+"/worker-listen", "--worker-id", "met",
		"--agents", "2", "--metrics-addr", "127.0.0.1:0", "--pprof")
	ops := "http://" + loggedAddr(t, agents, jsonAddr("agent ops endpoints listening"))
	s.waitWorkers(2)
	s.eventually("agents ready", func() bool { code, _ := scrape(ops + "/readyz"); return code == 200 })
	for i := 0; i < 3; i++ {
		if code, a := s.run(task(fmt.Sprintf("met-%d", i), "label-m", "")); code != 200 {
			t.Fatalf("task %d: %d %+v", i, code, a)
		}
	}
	_, disp := scrape("http://" + s.addr + "/metrics")
	_, agent := scrape(ops + "/metrics")
	for _, want := range []struct{ body, line string }{
		{disp, `smartroute_dispatcher_tasks_completed_total{label="label-m"} 3`},
		{disp, `smartroute_dispatcher_label_loads_total{label="label-m"} 1`},
		{disp, `smartroute_dispatcher_label_hits_total{label="label-m"} 2`},
		{disp, `smartroute_dispatcher_connected_workers 2`},
		{agent, `smartroute_agent_tasks_total{result="ok"} 3`},
		{agent, `smartroute_agent_label_loads_total{label="label-m",result="ok"} 1`},
		{agent, `smartroute_agent_connected 2`},
	} {
		if !strings.Contains(want.body, "\n"+want.line+"\n") {
			t.Errorf("/metrics lacks %q", want.line)
		}
	}
	if code, _ := scrape(ops + "/healthz"); code != 200 {
		t.Errorf("agent /healthz: %d", code)
	}
	if code, _ := scrape(ops + "/debug/pprof/"); code != 200 {
		t.Errorf("agent /debug/pprof/ with --pprof: %d", code)
	}
}
