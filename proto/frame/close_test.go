package frame

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/gorilla/websocket"
)

func TestCloseReasonCutsAtACharacter(t *testing.T) {
	t.Parallel()
	for _, reason := range []string{"", "short", strings.Repeat("a", 120), strings.Repeat("a", 200),
		strings.Repeat("a", 119) + "é and more", strings.Repeat("a", 118) + "日本", strings.Repeat("€", 60)} {
		got := CloseReason(reason)
		if len(got) > MaxCloseReason || !utf8.ValidString(got) || !strings.HasPrefix(reason, got) || len(reason)-len(got) > 0 && len(got) < MaxCloseReason-3 {
			t.Errorf("CloseReason(%q) = %q (%d bytes)", reason, got, len(got))
		}
	}
}

// Over a real WebSocket: the peer gets the code and the cut reason, not a protocol
// error.
func TestCloseReasonReachesThePeer(t *testing.T) {
	t.Parallel()
	reason := strings.Repeat("a", 119) + "ü: worker id from a hello"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := (&websocket.Upgrader{}).Upgrade(w, r, nil)
		if err != nil {
			return
		}
		_ = ws.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(4001, CloseReason(reason)))
		_, _, _ = ws.ReadMessage() // the peer's close reply
		ws.Close()
	}))
	t.Cleanup(srv.Close)
	ws, _, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(srv.URL, "http"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	_, _, err = ws.ReadMessage()
	var ce *websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != 4001 || ce.Text != strings.Repeat("a", 119) {
		t.Fatalf("peer read %v, want close 4001 with the reason cut before the ü", err)
	}
}
