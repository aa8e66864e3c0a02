package dispatcher

import (
	"encoding/json"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
)

// jsonContentType is the Content-Type of answers. Shared by every response: len equals
// cap, so a later Add copies it rather than writing into it.
var jsonContentType = []string{echo.MIMEApplicationJSON}

// answerBuffers recycles the buffers answers are encoded into.
var answerBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// writeAnswer writes a finished task's /run-task answer. Caller has received from
// rec.done.
func (d *Dispatcher) writeAnswer(c echo.Context, rec *taskRecord) error {
	if !rec.retryAt.IsZero() {
		if wait := rec.retryAt.Sub(d.hub.clock.Now()); wait > 0 {
			// Whole seconds, rounded up: retrying earlier would fail the same way.
			c.Response().Header().Set("Retry-After", strconv.FormatInt(int64((wait+time.Second-1)/time.Second), 10))
		}
	}
	return writeView(c, rec.answerStatus(), rec.view())
}

// writeView answers with a task view. It is the per-task answer, so it is encoded by
// hand rather than by reflection (encoding/json also re-validated the worker's result,
// which onResult has checked once already). The bytes are what encoding/json writes,
// up to the worker's result, which is embedded as the worker sent it.
func writeView(c echo.Context, status int, v taskView) error {
	bp := answerBuffers.Get().(*[]byte)
	b := v.appendJSON((*bp)[:0])
	b = append(b, '\n') // as json.Encoder, which c.JSON uses, ends its output
	// What c.Blob does, without looking the header up and canonicalising its name for
	// every answer.
	r := c.Response()
	r.Header()[echo.HeaderContentType] = jsonContentType
	r.WriteHeader(status)
	_, err := r.Write(b)
	if cap(b) <= 64<<10 { // a rare huge result is not kept
		*bp = b
		answerBuffers.Put(bp)
	}
	return err
}

// appendJSON appends the view as encoding/json would marshal it.
func (v *taskView) appendJSON(b []byte) []byte {
	b = append(b, `{"task_id":`...)
	b = appendString(b, v.TaskID)
	b = append(b, `,"status":`...)
	b = appendString(b, v.Status)
	b = append(b, `,"label":`...)
	b = appendString(b, v.Label)
	b = append(b, `,"task_type":`...)
	b = appendString(b, v.TaskType)
	if v.WorkerID != "" {
		b = append(b, `,"worker_id":`...)
		b = appendString(b, v.WorkerID)
	}
	b = append(b, `,"label_miss":`...)
	b = strconv.AppendBool(b, v.LabelMiss)
	b = append(b, `,"attempts":`...)
	b = strconv.AppendInt(b, int64(v.Attempts), 10)
	b = append(b, `,"queue_ms":`...)
	b = appendFloat(b, v.QueueMS)
	b = append(b, `,"load_ms":`...)
	b = appendFloat(b, v.LoadMS)
	b = append(b, `,"run_ms":`...)
	b = appendFloat(b, v.RunMS)
	if len(v.Result) > 0 {
		b = append(b, `,"result":`...)
		b = append(b, v.Result...)
	}
	if v.Error != "" {
		b = append(b, `,"error":`...)
		b = appendString(b, v.Error)
	}
	return append(b, '}')
}

// appendString appends s as a JSON string. Ids, labels and types are printable ASCII
// (checked on the way in) and go straight through; anything else — worker errors,
// mostly — goes through encoding/json, escaping included.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if escapedInJSON[s[i]] {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// escapedInJSON marks the bytes encoding/json does not write as they are: control
// characters, the quote and backslash, its HTML escapes, and non-ASCII (which it
// checks as UTF-8). A table: one load per byte of every string of every answer.
var escapedInJSON = func() (t [256]bool) {
	for c := range len(t) {
		t[c] = c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&'
	}
	return t
}()

// appendFloat formats like encoding/json: shortest form, exponent only outside
// [1e-6, 1e21). Durations are never NaN or infinite.
func appendFloat(b []byte, f float64) []byte {
	// The view's milliseconds come from whole nanoseconds (ms): f is the float64
	// nearest n/1e6. Every decimal of at most 15 significant digits round-trips
	// through a float64, so no shorter decimal names f, and n's digits with the point
	// six from the right are the shortest form, without strconv's general search
	// (three per answer: 0.15 us per request in the throughput profile). A wrong n
	// cannot pass the check: it would be a second such decimal naming f.
	if f > 0 && f < 1e9 {
		if n := int64(math.Round(f * 1e6)); float64(n)/1e6 == f {
			return appendMicros(b, n)
		}
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return append(b, '0')
	}
	abs := math.Abs(f)
	if abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		q, _ := json.Marshal(f)
		return append(b, q...)
	}
	return strconv.AppendFloat(b, f, 'f', -1, 64)
}

// appendMicros writes n millionths in decimal, without trailing zeros.
func appendMicros(b []byte, n int64) []byte {
	b = strconv.AppendInt(b, n/1e6, 10)
	frac := n % 1e6
	if frac == 0 {
		return b
	}
	var digits [7]byte // '.' and six places
	digits[0] = '.'
	for i := 6; i > 0; i-- {
		digits[i] = byte('0' + frac%10)
		frac /= 10
	}
	end := 7
	for digits[end-1] == '0' {
		end--
	}
	return append(b, digits[:end]...)
}
