package logcollector

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/smartroute/smartroute/proto/frame"
	pb "github.com/smartroute/smartroute/proto/smartroutev1"
	"github.com/tidwall/gjson"
)

func TestLogsQuery(t *testing.T) {
	t.Parallel()
	r := startCollector(t, Config{})
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	rec := func(worker string, sec int, level, event string) string {
		return fmt.Sprintf(`{"level":%q,"worker_id":%q,"event":%q,"time":%q}`, level, worker, event, base.Add(time.Duration(sec)*time.Second).Format(time.RFC3339Nano))
	}
	a, _ := connect(t, r.ingestURL(), "w1", "s1")
	a.batch(1, 0, rec("w1", 0, "info", "label_miss"), rec("w1", 2, "info", "task_completed"), rec("w1", 4, "warn", "task_refused"))
	a.batch(2, 0, rec("w1", 6, "error", "boom"), rec("w1", 8, "debug", "frame_sent"), `{"message":"no level, no time"}`)
	b, _ := connect(t, r.ingestURL(), "w.2/x", "s1")
	b.batch(1, 0, rec("w.2/x", 1, "info", "label_miss"), rec("w.2/x", 5, "info", "task_completed"))

	at := func(sec int) string {
		return url.QueryEscape(base.Add(time.Duration(sec) * time.Second).Format(time.RFC3339))
	}
	for _, tc := range []struct {
		query     string
		want      []string // worker:event of the records, in order
		truncated bool
	}{
		{"worker=w1", []string{"w1:label_miss", "w1:task_completed", "w1:task_refused", "w1:boom", "w1:frame_sent", "w1:"}, false},
		{"worker=w1&level=warn", []string{"w1:task_refused", "w1:boom"}, false},
		{"worker=w1&level=INFO&limit=2", []string{"w1:task_refused", "w1:boom"}, true},
		{"worker=w1&event=task_completed", []string{"w1:task_completed"}, false},
		{"worker=w1&since=" + at(2) + "&until=" + at(6), []string{"w1:task_completed", "w1:task_refused"}, false},
		{"worker=w1&limit=2", []string{"w1:frame_sent", "w1:"}, true},
		{"event=label_miss", []string{"w1:label_miss", "w.2/x:label_miss"}, false},
		{"level=info&limit=3", []string{"w1:task_refused", "w.2/x:task_completed", "w1:boom"}, true},
		{"worker=" + url.QueryEscape("w.2/x"), []string{"w.2/x:label_miss", "w.2/x:task_completed"}, false},
	} {
		code, body := r.get("/logs?" + tc.query)
		if code != 200 {
			t.Fatalf("%s: %d %s", tc.query, code, body)
		}
		var resp struct {
			Records []struct {
				WorkerID string `json:"worker_id"`
				Event    string `json:"event"`
			} `json:"records"`
			Count     int  `json:"count"`
			Truncated bool `json:"truncated"`
		}
		if err := json.Unmarshal(body, &resp); err != nil {
			t.Fatalf("%s: %v in %s", tc.query, err, body)
		}
		var got []string
		for _, r := range resp.Records {
			w := r.WorkerID
			if w == "" {
				w = "w1"
			}
			got = append(got, w+":"+r.Event)
		}
		if strings.Join(got, " ") != strings.Join(tc.want, " ") || resp.Count != len(got) || resp.Truncated != tc.truncated {
			t.Errorf("%s: got %v (count %d, truncated %v), want %v (truncated %v)", tc.query, got, resp.Count, resp.Truncated, tc.want, tc.truncated)
		}
	}
}

// A record whose level or event is not a string is still a record: shown by a query
// that does not filter on that field, left out by one that does.
func TestLogsQueryShowsRecordsWithOddFields(t *testing.T) {
	t.Parallel()
	r := startCollector(t, Config{})
	a, _ := connect(t, r.ingestURL(), "w3", "s1")
	a.batch(1, 0, `{"level":5,"event":{"k":1},"message":"numeric level"}`, `{"level":"warn","event":7,"message":"numeric event"}`,
		`{"level":"warn","event":"7","message":"string event"}`)
	for _, tc := range []struct {
		query string
		want  []string // messages, in order
	}{
		{"worker=w3", []string{"numeric level", "numeric event", "string event"}},
		{"worker=w3&level=warn", []string{"numeric event", "string event"}},
		{"worker=w3&event=7", []string{"string event"}},
	} {
		if got := r.messages(t, tc.query); strings.Join(got, "|") != strings.Join(tc.want, "|") {
			t.Errorf("%s: got %q, want %q", tc.query, got, tc.want)
		}
	}
}

// messages runs GET /logs?query and returns the records' "message" fields, in order.
func (r *running) messages(t *testing.T, query string) []string {
	t.Helper()
	code, body := r.get("/logs?" + query)
	var resp struct {
		Records []struct {
			Message string `json:"message"`
		} `json:"records"`
	}
	if err := json.Unmarshal(body, &resp); code != 200 || err != nil {
		t.Fatalf("%s: %d %s (%v)", query, code, body, err)
	}
	var got []string
	for _, rec := range resp.Records {
		got = append(got, rec.Message)
	}
	return got
}

// The filters read "level", "event" and "time" spelt so, and a level only as one of
// the seven names: encoding/json matched keys in any case ("EVENT" passed event=), and
// zerolog.ParseLevel took "disabled" and integer strings, which ranked above error.
func TestLogsQueryFiltersOnTheDocumentedFieldsOnly(t *testing.T) {
	t.Parallel()
	r := startCollector(t, Config{})
	a, _ := connect(t, r.ingestURL(), "w4", "s1")
	a.batch(1, 0,
		`{"level":"error","event":"label_miss","message":"real"}`,
		`{"level":"info","EVENT":"label_miss","message":"upper-case event"}`,
		`{"level":"debug","Level":"error","message":"upper-case level"}`,
		`{"level":"disabled","message":"disabled"}`,
		`{"level":"100","message":"number string"}`,
		`{"level":"error","Time":"2000-01-01T00:00:00Z","message":"upper-case time"}`,
	)
	for _, tc := range []struct {
		query string
		want  []string
	}{
		{"worker=w4&event=label_miss", []string{"real"}},
		{"worker=w4&level=error", []string{"real", "upper-case time"}},
		{"worker=w4&until=2001-01-01T00:00:00Z", nil}, // no record has a "time"
	} {
		if got := r.messages(t, tc.query); strings.Join(got, "|") != strings.Join(tc.want, "|") {
			t.Errorf("%s: got %q, want %q", tc.query, got, tc.want)
		}
	}
}

func TestLogsQueryErrors(t *testing.T) {
	t.Parallel()
	r := startCollector(t, Config{})
	a, _ := connect(t, r.ingestURL(), "w1", "s1")
	a.batch(1, 0, `{"level":"info"}`)
	for _, tc := range []struct {
		query string
		code  int
		want  string
	}{
		{"since=yesterday", 400, `since "yesterday": want an RFC 3339 time`},
		{"until=2026-13-01T00:00:00Z", 400, "until"},
		{"since=-5m", 400, "must not be negative"},
		{"since=2026-03-02T00:00:00Z&until=2026-03-01T00:00:00Z", 400, "since (2026-03-02T00:00:00Z) must be before until"},
		{"limit=-1", 400, "limit must be between 1 and 10000, got -1"},
		{"limit=0", 400, "limit must be between 1 and 10000, got 0"},
		{"limit=100001", 400, "limit must be between 1 and 10000"},
		{"limit=ten", 400, `limit "ten" is not an integer`},
		{"level=loud", 400, `level "loud" is not one of`},
		{"worker=a%20b", 400, "worker may hold only printable ASCII"},
		{"wroker=w1", 400, `unknown parameter "wroker" (known: worker, level, event, since, until, limit)`},
		{"limit=1&limit=2", 400, `parameter "limit" given 2 times`},
		// A query string that does not parse is refused, not read in part: a dropped
		// filter would answer 200 with records the caller did not ask for.
		{"worker=w1&level=error%zz", 400, "query string:"},
		{"level=error;", 400, "query string:"},
		{"worker=w1;level=error", 400, "query string:"},
		// Only the level names: zerolog also reads integers, which no record carries.
		{"level=42", 400, `level "42" is not one of`},
		{"level=-9", 400, `level "-9" is not one of`},
		{"worker=nobody", 404, "no logs for this worker: nobody"},
	} {
		code, body := r.get("/logs?" + tc.query)
		var e errorBody
		_ = json.Unmarshal(body, &e)
		if code != tc.code || !strings.Contains(e.Error, tc.want) {
			t.Errorf("%s: %d %s, want %d with %q", tc.query, code, body, tc.code, tc.want)
		}
	}
}

// since and until also take a duration before now.
func TestQueryDurationMeansAgo(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	q, err := parseLogQuery("since=90m&until=2026-03-01T11:59:00.5Z", now)
	if err != nil || !q.since.Equal(now.Add(-90*time.Minute)) || !q.until.Equal(time.Date(2026, 3, 1, 11, 59, 0, 5e8, time.UTC)) {
		t.Fatalf("%+v %v", q, err)
	}
	if _, ok := q.match([]byte(`{"time":"2026-03-01T11:00:00+01:00"}`)); ok {
		t.Fatal("a record at 10:00Z matched since 10:30Z")
	}
	if _, ok := q.match([]byte(`{"time":1772362800}`)); !ok { // 2026-03-01T11:00:00Z in Unix seconds
		t.Fatal("a record at 11:00Z (Unix seconds) did not match")
	}
}

// A "time" beyond what a time can hold, or outside the years 0001 to 9999, is no time:
// 1e300 or -1e300 used to become year 292277026304 on amd64, passing any since= and
// sorting after every record.
func TestRecordTimeOutOfRangeIsNoTime(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"1e300", "-1e300", "1e999", "-1e999", "9223372036854775807", "1e19", "-62135596800",
		"253402300800", `"0000-06-01T00:00:00Z"`, `"0001-01-01T00:00:00Z"`, `"9999-12-31T23:00:00-05:00"`, "true", "null", `"yesterday"`} {
		if tm, ok := recordTime(gjson.Parse(v)); ok || !tm.IsZero() {
			t.Errorf("time %s read as %v, %v; want no time", v, tm, ok)
		}
	}
	for v, want := range map[string]time.Time{
		"1772362800":             time.Date(2026, 3, 1, 11, 0, 0, 0, time.UTC),
		"-1.5":                   time.Date(1969, 12, 31, 23, 59, 58, 5e8, time.UTC),
		"-62135596799":           time.Date(1, 1, 1, 0, 0, 1, 0, time.UTC),
		"253402300799":           time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC),
		`"9999-12-31T23:59:59Z"`: time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC),
		`"2026-03-01T12:00:00Z"`: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC),
		`"0001-01-01T00:00:01Z"`: time.Date(1, 1, 1, 0, 0, 1, 0, time.UTC),
		"1772362800.25":          time.Date(2026, 3, 1, 11, 0, 0, 25e7, time.UTC),
	} {
		if tm, ok := recordTime(gjson.Parse(v)); !ok || !tm.Equal(want) {
			t.Errorf("time %s read as %v, %v; want %v", v, tm, ok, want)
		}
	}
	q, err := parseLogQuery("since=2026-03-01T00:00:00Z", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range []string{`{"time":1e300}`, `{"time":-1e300}`} {
		if _, ok := q.match([]byte(rec)); ok {
			t.Errorf("%s matched since 2026-03-01", rec)
		}
	}
}

// FuzzParseLogsQuery: no query string crashes the parser, and what it accepts is within
// its documented bounds.
func FuzzParseLogsQuery(f *testing.F) {
	for _, s := range []string{
		"", "worker=w1&level=warn&since=2026-03-01T12:00:00Z&until=1h&limit=10", "limit=-1", "since=15m",
		"level=%ff", "level=error%zz", "worker=w1;level=error", "level=42", "worker=%00", "a=1&a=2", "since=9999999999h", "limit=99999999999999999999",
	} {
		f.Add(s)
	}
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := parseLogQuery(raw, now)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error message")
			}
			return
		}
		if _, perr := url.ParseQuery(raw); perr != nil {
			t.Fatalf("%q does not parse, yet was accepted", raw)
		}
		if q.limit < 1 || q.limit > MaxQueryLimit {
			t.Fatalf("limit %d accepted", q.limit)
		}
		if q.worker != "" && frame.CheckWorkerIDField("worker", q.worker) != nil {
			t.Fatalf("worker %q accepted", q.worker)
		}
		if !q.since.IsZero() && !q.until.IsZero() && !q.since.Before(q.until) {
			t.Fatalf("since %v not before until %v", q.since, q.until)
		}
		q.match([]byte(`{"level":"info","time":"2026-03-01T11:00:00Z","event":"x"}`))
	})
}

// FuzzDecodeLogFrame: no frame crashes the decoder or the line writer, every line
// written for an accepted batch is one JSON object, the lines are the size planned
// before they are written (the limit and rotation go by it), and the records counted
// before decoding are at least those decoded (maxBatchRecords goes by them).
func FuzzDecodeLogFrame(f *testing.F) {
	for _, env := range []*pb.LogEnvelope{
		{Body: &pb.LogEnvelope_Hello{Hello: &pb.LogHello{ProtocolVersion: 1, WorkerId: "w1", StreamId: "s"}}},
		{Body: &pb.LogEnvelope_Batch{Batch: &pb.LogBatch{Seq: 1, Dropped: 2, Records: [][]byte{[]byte(`{"a":1}`), []byte("x\ny"), []byte("{\n\"b\": 2\n}")}}}},
		{Body: &pb.LogEnvelope_Ack{Ack: &pb.LogAck{Seq: 9}}},
	} {
		b, _ := protoMarshal(env)
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{0x12, 0x80})
	f.Fuzz(func(t *testing.T, b []byte) {
		env, err := decodeLogFrame(b, 1<<16)
		if err != nil {
			return
		}
		if env.GetBody() == nil {
			t.Fatal("accepted a frame with no body")
		}
		batch := env.GetBatch()
		if batch == nil {
			return
		}
		if n := countBatchRecords(b); n < len(batch.GetRecords()) {
			t.Fatalf("counted %d records before decoding, decoded %d: the count bounds nothing", n, len(batch.GetRecords()))
		}
		lines := newBatchLines("w1", batch, batch.GetSeq()/2, 0)
		var buf bytes.Buffer
		if n, err := lines.WriteTo(&buf); err != nil || n != lines.Size() || int64(buf.Len()) != n {
			t.Fatalf("wrote %d bytes (%v), %d in the buffer, of lines sized %d", n, err, buf.Len(), lines.Size())
		}
		out := buf.Bytes()
		if len(out) == 0 {
			return // an empty batch writes nothing
		}
		if out[len(out)-1] != '\n' {
			t.Fatalf("output does not end with a newline: %q", out)
		}
		for l := range strings.SplitSeq(strings.TrimSuffix(string(out), "\n"), "\n") {
			var obj map[string]any
			if err := json.Unmarshal([]byte(l), &obj); err != nil {
				t.Fatalf("line %q is not a JSON object: %v", l, err)
			}
		}
	})
}

// GET /logs holds and returns at most MaxQueryBytes of records, the newest kept: with
// records up to a frame long, limit=10000 of them would otherwise exhaust memory.
func TestLogsQueryBytesAreBounded(t *testing.T) {
	t.Parallel()
	const budget = 2000
	r := startCollector(t, Config{hooks: &testHooks{queryBytes: budget}})
	for _, worker := range []string{"w1", "w2"} {
		a, _ := connect(t, r.ingestURL(), worker, "s1")
		var recs []string
		for i := range 20 {
			recs = append(recs, fmt.Sprintf(`{"level":"info","time":"2026-03-01T12:00:%02dZ","worker":%q,"i":%d,"pad":%q}`,
				i, worker, i, strings.Repeat("x", 200)))
		}
		a.batch(1, 0, recs...)
	}
	for _, path := range []string{"/logs?worker=w1&limit=10000", "/logs?limit=10000"} {
		code, body := r.get(path)
		var resp struct {
			Records   []json.RawMessage `json:"records"`
			Truncated bool              `json:"truncated"`
		}
		if code != 200 || json.Unmarshal(body, &resp) != nil {
			t.Fatalf("%s = %d %s", path, code, body)
		}
		held := 0
		for _, rec := range resp.Records {
			held += len(rec)
		}
		if held > budget || len(resp.Records) == 0 || !resp.Truncated {
			t.Fatalf("%s: %d records of %d bytes, truncated %v; want at most %d bytes, truncated", path, len(resp.Records), held, resp.Truncated, budget)
		}
		var newest struct{ I int }
		if err := json.Unmarshal(resp.Records[len(resp.Records)-1], &newest); err != nil || newest.I != 19 {
			t.Fatalf("%s: newest record %s, want i 19", path, resp.Records[len(resp.Records)-1])
		}
	}
}

// "The most recent limit records, oldest first" is by record time, not by place in the
// file: an old agent process's last flush can land after its successor's records (or
// a backlog be resent after an outage). A record without a time keeps its place after
// the one before it in the file (TestLogsQuery's last record).
func TestLogsQueryMostRecentIsByRecordTime(t *testing.T) {
	t.Parallel()
	r := startCollector(t, Config{})
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	rec := func(sec int) string {
		return fmt.Sprintf(`{"level":"info","sec":%d,"time":%q}`, sec, base.Add(time.Duration(sec)*time.Second).Format(time.RFC3339Nano))
	}
	newer, _ := connect(t, r.ingestURL(), "w1", "new-process")
	newer.batch(1, 0, rec(10), rec(11))
	older, _ := connect(t, r.ingestURL(), "w1", "old-process") // its last flush arrives late
	older.batch(1, 0, rec(5))

	secs := func(query string) []int {
		code, body := r.get("/logs?" + query)
		if code != 200 {
			t.Fatalf("%s: %d %s", query, code, body)
		}
		var resp struct {
			Records []struct {
				Sec int `json:"sec"`
			} `json:"records"`
		}
		if err := json.Unmarshal(body, &resp); err != nil {
			t.Fatal(err)
		}
		var out []int
		for _, rec := range resp.Records {
			out = append(out, rec.Sec)
		}
		return out
	}
	if got := secs("worker=w1"); fmt.Sprint(got) != "[5 10 11]" {
		t.Errorf("worker=w1: seconds %v, want oldest first [5 10 11]", got)
	}
	if got := secs("worker=w1&limit=1"); fmt.Sprint(got) != "[11]" {
		t.Errorf("worker=w1&limit=1: seconds %v, want the most recent record [11]", got)
	}
	// A time out of range is no time: the record keeps its place after the one before
	// it (here the last, 5), not the newest of all as year 292277026304.
	older.batch(2, 0, `{"level":"info","sec":-1,"time":-1e300}`, rec(12))
	if got := secs("worker=w1&limit=2"); fmt.Sprint(got) != "[11 12]" {
		t.Errorf("worker=w1&limit=2: seconds %v, want [11 12]", got)
	}
	if got := secs("worker=w1"); fmt.Sprint(got) != "[5 -1 10 11 12]" {
		t.Errorf("worker=w1: seconds %v, want [5 -1 10 11 12]", got)
	}
}

// FuzzMatchRecord: a record line is a worker's, not ours to vouch for. Its time is
// either none (zero) or one within the years 0001 to 9999 that is what the record
// says, to float precision for Unix seconds; match never panics, and what it passes
// through since and until has a time within them.
func FuzzMatchRecord(f *testing.F) {
	for _, s := range []string{
		`{"level":"info","event":"x","time":"2026-03-01T11:00:00Z"}`, `{"time":1772362800.5}`, `{"time":1e300}`, `{"time":-1e300}`,
		`{"time":1e999}`, `{"time":-62135596800}`, `{"time":253402300799.999999}`, `{"time":"0000-01-01T00:00:00Z"}`,
		`{"time":"9999-12-31T23:59:59.999999999-23:59"}`, `{"time":null}`, `{"time":[1]}`, `{"message":"no time"}`, `[1]`, `{"time":-0}`, `{`,
	} {
		f.Add([]byte(s))
	}
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	var queries []logQuery
	for _, raw := range []string{"", "since=2026-03-01T10:00:00Z&until=2026-03-01T11:30:00Z", "level=info&event=x", "until=1h"} {
		q, err := parseLogQuery(raw, now)
		if err != nil {
			f.Fatal(err)
		}
		queries = append(queries, q)
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		v := gjson.GetBytes(line, "time")
		rt, ok := recordTime(v)
		switch {
		case !ok && !rt.IsZero():
			t.Fatalf("no time, yet %v", rt)
		case ok && (!rt.After(minRecordTime) || !rt.Before(maxRecordTime)):
			t.Fatalf("time %v out of range", rt)
		case ok && v.Type == gjson.String:
			if p, err := time.Parse(time.RFC3339Nano, v.Str); err != nil || !p.Equal(rt) {
				t.Fatalf("time %q read as %v", v.Str, rt)
			}
		case ok && v.Type == gjson.Number:
			got := float64(rt.Unix()) + float64(rt.Nanosecond())/1e9
			if math.Abs(got-v.Num) > 1e-6+math.Abs(v.Num)*1e-15 {
				t.Fatalf("time %v read as %v (%v)", v.Num, rt, got)
			}
		case ok:
			t.Fatalf("a %v read as time %v", v.Type, rt)
		}
		for i, q := range queries {
			mt, matched := q.match(line)
			if !matched {
				continue
			}
			if !gjson.ValidBytes(line) {
				t.Fatalf("query %d matched %q, which is not JSON", i, line)
			}
			if !mt.Equal(rt) {
				t.Fatalf("query %d: match read time %v, recordTime %v", i, mt, rt)
			}
			if (!q.since.IsZero() || !q.until.IsZero()) && (!ok || mt.Before(q.since) || !q.until.IsZero() && !mt.Before(q.until)) {
				t.Fatalf("query %d passed time %v (%v)", i, mt, ok)
			}
		}
	})
}
