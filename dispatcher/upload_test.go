package dispatcher

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// newUploader serves handler as a fake uploader service and returns its URL.
func newUploader(t *testing.T, handler http.HandlerFunc) string {
	t.Helper()
	up := httptest.NewServer(handler)
	t.Cleanup(up.Close)
	return up.URL
}

// The uploader's answers other than 2xx are not passed on: an HTML error page, or a
// 401 or 404 a producer would take for the dispatcher's own, is a 502 whose JSON error
// names the uploader's status and the start of its answer. A redirect is such an answer
// too, not followed: the producer's body is never re-posted elsewhere. 2xx passes.
func TestUploaderNon2xxAnswersAre502(t *testing.T) {
	t.Parallel()
	elsewhere := make(chan string, 4)
	other := newUploader(t, func(w http.ResponseWriter, r *http.Request) { elsewhere <- r.Method + " " + r.URL.Path })
	for _, tc := range []struct {
		name   string
		answer func(w http.ResponseWriter)
		status int
		want   string
	}{
		{"html 500", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(500)
			io.WriteString(w, "<html>\n<body>Internal Server Error</body></html>")
		}, 502, "uploader answered 500 Internal Server Error: <html> <body>Internal Server Error</body></html>"},
		{"401", func(w http.ResponseWriter) { http.Error(w, `{"error":"bad token"}`, 401) }, 502, `uploader answered 401 Unauthorized: {"error":"bad token"}`},
		{"404 empty", func(w http.ResponseWriter) { w.WriteHeader(404) }, 502, "uploader answered 404 Not Found"},
		{"long", func(w http.ResponseWriter) { w.WriteHeader(503); io.WriteString(w, strings.Repeat("é", 300)) }, 502,
			"uploader answered 503 Service Unavailable: " + strings.Repeat("é", 100) + "..."},
		{"307", func(w http.ResponseWriter) { w.Header().Set("Location", other+"/steal"); w.WriteHeader(307) }, 502,
			"uploader answered 307 Temporary Redirect (redirect to " + other + "/steal, not followed)"},
		{"308", func(w http.ResponseWriter) { w.Header().Set("Location", other+"/steal"); w.WriteHeader(308) }, 502,
			"uploader answered 308 Permanent Redirect"},
		{"201", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(201)
			io.WriteString(w, `{"status":"queued"}`)
		}, 201, ""},
	} {
		up := newUploader(t, func(w http.ResponseWriter, _ *http.Request) { tc.answer(w) })
		b := setup(t, Config{UploaderURL: up})
		resp, err := b.client().Post(b.srv.URL+"/upload-model", "application/json", strings.NewReader(`{"model_id":"m"}`))
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var body errorBody
		if err := json.Unmarshal(raw, &body); err != nil || resp.StatusCode != tc.status ||
			resp.Header.Get("Content-Type") != "application/json" || !strings.HasPrefix(body.Error, tc.want) {
			t.Errorf("%s: answered %d %s %q; want %d JSON with error %q...", tc.name, resp.StatusCode,
				resp.Header.Get("Content-Type"), raw, tc.status, tc.want)
		}
	}
	select {
	case hit := <-elsewhere:
		t.Errorf("a redirect was followed: %s", hit)
	default:
	}
}

// --max-body-bytes bounds an /upload-model body as it bounds a task's: 413, and the
// uploader never sees the request.
func TestUploadBodyOverMaxBodyBytesIs413(t *testing.T) {
	t.Parallel()
	hits := make(chan struct{}, 1)
	up := newUploader(t, func(w http.ResponseWriter, _ *http.Request) { hits <- struct{}{} })
	b := setup(t, Config{UploaderURL: up, MaxBodyBytes: 64})
	code, v := b.post("/upload-model", `{"model_id":"`+strings.Repeat("m", 100)+`"}`)
	if code != 413 || !strings.Contains(v["error"].(string), "larger than 64 bytes") {
		t.Fatalf("oversized upload request: %d %v", code, v)
	}
	select {
	case <-hits:
		t.Fatal("the oversized request reached the uploader")
	default:
	}
}
