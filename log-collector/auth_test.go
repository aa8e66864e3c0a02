package logcollector

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/smartroute/smartroute/worker-agent/logship"
)

// With IngestTokens, /ingest refuses a stream without the token before the upgrade,
// and the agent's shipper, sending its worker token, is served.
func TestIngestToken(t *testing.T) {
	t.Parallel()
	r := startCollector(t, Config{IngestTokens: []string{"tok-1"}})
	_, resp, err := dialIngest(t, r.ingestURL(), "w1")
	if err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("no token: err %v resp %v, want 401", err, resp)
	}
	resp.Body.Close()

	wrong, err := logship.New(logship.Config{URL: r.ingestURL(), WorkerID: "w-wrong", Token: "nope", CloseTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	wrong.Write([]byte(`{"event":"from_wrong"}` + "\n"))
	if err := wrong.Close(); err == nil {
		t.Fatal("a shipper with a wrong token delivered its records")
	}

	ship, err := logship.New(logship.Config{URL: r.ingestURL(), WorkerID: "w1", Token: "tok-1"})
	if err != nil {
		t.Fatal(err)
	}
	ship.Write([]byte(`{"event":"from_right"}` + "\n"))
	if err := ship.Close(); err != nil {
		t.Fatalf("shipper with the token: %v", err)
	}
	if code, body := r.get("/logs?worker=w1"); code != 200 || !strings.Contains(string(body), "from_right") {
		t.Fatalf("/logs: %d %s", code, body)
	}
	if code, _ := r.get("/logs?worker=w-wrong"); code != 404 {
		t.Fatalf("the refused worker has logs: %d", code)
	}
}
