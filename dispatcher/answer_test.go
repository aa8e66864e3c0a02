package dispatcher

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
)

// writeView answers as c.JSON would: the status, a JSON Content-Type, the view and a
// newline; and a second answer does not see the first one's header.
func TestWriteViewAnswersJSON(t *testing.T) {
	t.Parallel()
	e := echo.New()
	v := taskView{TaskID: "t-1", Status: statusCompleted, Label: "m", TaskType: "x"}
	for _, status := range []int{http.StatusOK, http.StatusGatewayTimeout} {
		rec := httptest.NewRecorder()
		c := e.NewContext(httptest.NewRequest(http.MethodPost, "/run-task", nil), rec)
		if err := writeView(c, status, v); err != nil {
			t.Fatal(err)
		}
		rec.Header().Add(echo.HeaderContentType, "mutated") // must not reach the shared value
		want, _ := json.Marshal(v)
		if rec.Code != status || rec.Body.String() != string(want)+"\n" {
			t.Fatalf("answer %d %q, want %d %s", rec.Code, rec.Body.String(), status, want)
		}
		if got := rec.Header().Values(echo.HeaderContentType)[0]; got != echo.MIMEApplicationJSON {
			t.Fatalf("Content-Type %q", got)
		}
	}
	if len(jsonContentType) != 1 || jsonContentType[0] != echo.MIMEApplicationJSON {
		t.Fatalf("the shared Content-Type value was changed: %q", jsonContentType)
	}
}

// The hand-written answer is byte for byte what encoding/json makes of the view
// (for a compact result, which is what workers send).
func TestAnswerMatchesEncodingJSON(t *testing.T) {
	t.Parallel()
	views := []taskView{
		{TaskID: "t-1", Status: statusCompleted, Label: "label-1", TaskType: "sample_task", WorkerID: "w-1", LabelMiss: true,
			Attempts: 2, QueueMS: 0.0123, LoadMS: 400.25, RunMS: 40, Result: json.RawMessage(`{"a":[1,2,"x"]}`)},
		{TaskID: "t-2", Status: statusQueued, Label: "m", TaskType: "x"},
		{TaskID: "t-3", Status: statusFailed, Label: "m", TaskType: "x", Attempts: 3, QueueMS: 1e-9, RunMS: 1e22,
			Error: "worker error: \"bad\" <input> & \u2028 \x01 \xff"},
	}
	for _, v := range views {
		want, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if got := v.appendJSON(nil); !bytes.Equal(got, want) {
			t.Errorf("got  %s\nwant %s", got, want)
		}
	}
}

// Milliseconds made from durations (appendFloat's fast path) are written as
// encoding/json writes them, at the edges of the fast path and across its range.
func TestDurationMillisMatchEncodingJSON(t *testing.T) {
	t.Parallel()
	ds := []time.Duration{0, 1, 9, 10, 999, 1000, 1001, 35123, 100_000, 999_999, 1_000_000, 1_000_001,
		1_234_567, 40 * time.Millisecond, 400*time.Millisecond + 250*time.Microsecond, time.Hour + 1,
		999_999_999_999_999, 1_000_000_000_000_000, 1_000_000_000_000_001, 1<<53 - 1, 1 << 53, 1<<63 - 1}
	r := rand.New(rand.NewPCG(1, 2))
	for range 200_000 {
		ds = append(ds, time.Duration(r.Int64N(1_000_000_000_000_000)), time.Duration(r.Int64N(100_000_000)))
	}
	for _, d := range ds {
		want, err := json.Marshal(ms(d))
		if err != nil {
			t.Fatal(err)
		}
		if got := appendFloat(nil, ms(d)); !bytes.Equal(got, want) {
			t.Fatalf("%d ns: got %s, want %s", d, got, want)
		}
	}
}

// FuzzAnswer: any strings and numbers encode to JSON that decodes back to the view.
func FuzzAnswer(f *testing.F) {
	f.Add("t-1", "label", "worker error: <x>", 1.5, 0.0000001, 3, int64(35123))
	f.Fuzz(func(t *testing.T, id, label, errMsg string, queue, run float64, attempts int, load int64) {
		v := taskView{TaskID: id, Status: statusFailed, Label: label, TaskType: "x", QueueMS: queue, RunMS: run, Attempts: attempts, Error: errMsg,
			LoadMS: ms(time.Duration(load))}
		want, err := json.Marshal(v)
		if err != nil {
			return // NaN and infinities: durations are never either
		}
		if got := v.appendJSON(nil); !bytes.Equal(got, want) {
			t.Fatalf("got  %s\nwant %s", got, want)
		}
	})
}

func BenchmarkAnswerAppend(b *testing.B) {
	v := taskView{TaskID: "wrk-1-12345", Status: statusCompleted, Label: "label-3", TaskType: "sample_task",
		WorkerID: "tp-1-3", Attempts: 1, QueueMS: 0.0123, RunMS: 0.0011,
		Result: json.RawMessage(`{"task_id":"wrk-1-12345","label":"label-3","echo":{"data":"sample"}}`)}
	buf := make([]byte, 0, 512)
	b.ReportAllocs()
	for b.Loop() {
		buf = v.appendJSON(buf[:0])
	}
}
