package dispatcher

import (
	"net/http"
	"strings"
	"testing"

	"github.com/gorilla/websocket"
)

// Without API keys (development mode, on loopback), a request a web page on another
// site sends is refused with 403 before any handler: a "simple" text/plain POST to
// /run-task or a drain needs no CORS preflight, so any page the developer opens could
// drive the dispatcher. Programs send no Origin and are served; so are pages on this
// machine.
func TestDevModeRefusesRequestsFromOtherSites(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	b.dial("w1", "m")
	for _, tc := range []struct {
		header []string
		want   int
	}{
		{[]string{"Origin", "https://evil.example"}, 403},
		{[]string{"Origin", "http://evil.example:8080"}, 403}, // a rebound DNS name on our port
		{[]string{"Origin", "null"}, 403},                     // a sandboxed frame, a file
		{[]string{"Sec-Fetch-Site", "cross-site"}, 403},
		{[]string{"Origin", "http://127.0.0.1:3000", "Sec-Fetch-Site", "cross-site"}, 403},
		{nil, 202}, // curl, producers
		{[]string{"Origin", "http://localhost:3000", "Sec-Fetch-Site", "same-site"}, 202},
		{[]string{"Origin", "http://[::1]:5173"}, 202},
		{[]string{"Sec-Fetch-Site", "same-origin"}, 202},
		{[]string{"Sec-Fetch-Site", "none"}, 202}, // typed in the address bar
	} {
		h := append([]string{"Content-Type", "text/plain"}, tc.header...)
		code, _, v := b.send("POST", "/run-task", `{"task_type":"x","label":"m","return_result":false}`, h...)
		if code != tc.want {
			t.Errorf("/run-task with %q: %d %v, want %d", tc.header, code, v, tc.want)
		}
		if msg, _ := v["error"].(string); code == 403 && !strings.Contains(msg, "another site") {
			t.Errorf("/run-task with %q: error %q does not say why", tc.header, msg)
		}
	}
	if code, _, v := b.send("POST", "/workers/w1/drain", "", "Content-Type", "text/plain", "Origin", "https://evil.example"); code != 403 {
		t.Errorf("cross-site drain: %d %v, want 403", code, v)
	}
	if ids := b.workers(); len(ids) != 1 {
		t.Errorf("workers after a cross-site drain: %q", ids)
	}
	// A page's WebSocket to /worker-listen carries its Origin too.
	h := http.Header{"Worker-Id": {"page"}, "Origin": {"https://evil.example"}}
	if _, resp, err := websocket.DefaultDialer.Dial(b.wsURL(), h); err == nil || resp == nil || resp.StatusCode != 403 {
		t.Errorf("cross-site /worker-listen: %v %v, want 403", resp, err)
	}
}

// With API keys the check is not applied: a page cannot add the key to a cross-origin
// request without a CORS preflight the dispatcher never grants, so a request that
// carries one is a program's (a browser extension's, a proxy's) and is served.
func TestCrossSiteCheckNeedsNoKeysConfigured(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{APIKeys: []string{"producer-key"}})
	code, _, v := b.send("POST", "/run-task", `{"task_type":"x","label":"m","return_result":false}`,
		"Origin", "https://dashboard.example", "X-API-Key", "producer-key")
	if code != 202 {
		t.Fatalf("keyed request with an Origin: %d %v, want 202", code, v)
	}
	if code, _, _ := b.send("POST", "/run-task", `{"task_type":"x","label":"m"}`, "Origin", "https://evil.example"); code != 401 {
		t.Fatalf("cross-site request without a key: %d, want 401", code)
	}
}
