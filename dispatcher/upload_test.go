package dispatcher

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// newUploader serves handler as a fake uploader service and returns its URL.
func newUploader(t *testing.T, handler http.HandlerFunc) string {
	t.Helper()
	up := httptest.NewServer(handler)
	t.Cleanup(up.Close)
	return up.URL
}
