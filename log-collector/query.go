package logcollector

import (
	"bufio"
	"bytes"
	"cmp"
	"container/heap"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"github.com/tidwall/gjson"

	"github.com/smartroute/smartroute/proto/frame"
)

// Limits of GET /logs.
const (
	DefaultQueryLimit = 100
	MaxQueryLimit     = 10000
	// MaxQueryBytes bounds the record bytes one GET /logs holds and returns: records
	// may be up to a frame long (16 MiB), and limit × that would take the collector
	// down. Older matches beyond it are left out, as beyond limit.
	MaxQueryBytes = 64 << 20
)

var queryParams = []string{"worker", "level", "event", "since", "until", "limit"}

// logQuery is a parsed GET /logs query.
type logQuery struct {
	worker   string        // empty: every worker
	minLevel zerolog.Level // records at this level or above; NoLevel: any record
	event    string        // the record's "event" field must equal it; empty: any
	since    time.Time     // records at or after it; zero: no bound
	until    time.Time     // records before it; zero: no bound
	limit    int
	maxBytes int // record bytes held and returned; MaxQueryBytes unless a test lowers it
}

// queryLevels are the level names a query takes. Not zerolog.ParseLevel, which also
// reads integers ("42") that no record's level is.
var queryLevels = map[string]zerolog.Level{
	"trace": zerolog.TraceLevel, "debug": zerolog.DebugLevel, "info": zerolog.InfoLevel, "warn": zerolog.WarnLevel,
	"error": zerolog.ErrorLevel, "fatal": zerolog.FatalLevel, "panic": zerolog.PanicLevel,
}

// parseLogQuery validates the raw query string of GET /logs; its errors are meant for
// the caller and name the parameter. now anchors durations ("since=15m"). The raw
// string, not echo's QueryParams: those drop the parse error and with it any pair after
// a bad escape or a semicolon, so a filter would silently be lost.
func parseLogQuery(raw string, now time.Time) (logQuery, error) {
	q := logQuery{minLevel: zerolog.NoLevel, limit: DefaultQueryLimit, maxBytes: MaxQueryBytes}
	v, err := url.ParseQuery(raw)
	if err != nil {
		return q, fmt.Errorf("query string: %w", err)
	}
	for name, vals := range v {
		if !slices.Contains(queryParams, name) {
			return q, fmt.Errorf("unknown parameter %q (known: %s)", name, strings.Join(queryParams, ", "))
		}
		if len(vals) > 1 {
			return q, fmt.Errorf("parameter %q given %d times, want once", name, len(vals))
		}
	}
	if w := v.Get("worker"); w != "" {
		if err := frame.CheckWorkerIDField("worker", w); err != nil {
			return q, err
		}
		q.worker = w
	}
	if l := v.Get("level"); l != "" {
		lvl, ok := queryLevels[strings.ToLower(l)]
		if !ok {
			return q, fmt.Errorf("level %q is not one of trace, debug, info, warn, error, fatal, panic", l)
		}
		q.minLevel = lvl
	}
	q.event = v.Get("event")
	if q.since, err = parseQueryTime("since", v.Get("since"), now); err != nil {
		return q, err
	}
	if q.until, err = parseQueryTime("until", v.Get("until"), now); err != nil {
		return q, err
	}
	if !q.since.IsZero() && !q.until.IsZero() && !q.since.Before(q.until) {
		return q, fmt.Errorf("since (%s) must be before until (%s)", q.since.Format(time.RFC3339Nano), q.until.Format(time.RFC3339Nano))
	}
	if s := v.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			return q, fmt.Errorf("limit %q is not an integer", s)
		}
		if n < 1 || n > MaxQueryLimit {
			return q, fmt.Errorf("limit must be between 1 and %d, got %d", MaxQueryLimit, n)
		}
		q.limit = n
	}
	return q, nil
}

// parseQueryTime reads an RFC 3339 time or a duration before now ("15m").
func parseQueryTime(name, s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			return time.Time{}, fmt.Errorf("%s %q: a duration means that long ago and must not be negative", name, s)
		}
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("%s %q: want an RFC 3339 time such as 2006-01-02T15:04:05Z or a duration ago such as 15m", name, s)
}

// matchedRecord is a record a query returns.
type matchedRecord struct {
	raw    []byte // a copy of the record's line
	time   time.Time
	worker int // place of its worker in the query's list: on equal times the earlier worker's record comes first
	seq    int // place among the worker's matches, in file order
}

func byTimeThenSeq(a, b matchedRecord) int {
	return cmp.Or(a.time.Compare(b.time), cmp.Compare(a.worker, b.worker), cmp.Compare(a.seq, b.seq))
}

// recordHeap keeps a query's most recent matches: its top is the oldest.
type recordHeap []matchedRecord

func (h recordHeap) Len() int           { return len(h) }
func (h recordHeap) Less(i, j int) bool { return byTimeThenSeq(h[i], h[j]) < 0 }
func (h recordHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *recordHeap) Push(x any)        { *h = append(*h, x.(matchedRecord)) }
func (h *recordHeap) Pop() any {
	old := *h
	r := old[len(old)-1]
	old[len(old)-1] = matchedRecord{} // hold no record's bytes
	*h = old[:len(old)-1]
	return r
}

// match reports whether line passes q, and its time. It reads the top-level "level",
// "event" and "time" spelt exactly so (not encoding/json, whose keys match in any
// case), and a level only by one of the seven names. A record whose field is of
// another kind (a worker's logger is not ours to vouch for) is still a record: it only
// fails a filter on that field.
func (q *logQuery) match(line []byte) (time.Time, bool) {
	if !gjson.ValidBytes(line) {
		return time.Time{}, false
	}
	f := gjson.GetManyBytes(line, "level", "event", "time")
	if q.minLevel != zerolog.NoLevel {
		lvl, ok := queryLevels[f[0].Str]
		if f[0].Type != gjson.String || !ok || lvl < q.minLevel {
			return time.Time{}, false
		}
	}
	if q.event != "" && (f[1].Type != gjson.String || f[1].Str != q.event) {
		return time.Time{}, false
	}
	t, ok := recordTime(f[2])
	if (!q.since.IsZero() || !q.until.IsZero()) && !ok {
		return time.Time{}, false
	}
	if !q.since.IsZero() && t.Before(q.since) || !q.until.IsZero() && !t.Before(q.until) {
		return time.Time{}, false
	}
	return t, true
}

// errUnknownWorker: the queried worker has no logs here.
var errUnknownWorker = errors.New("no logs for this worker")

// logsResponse is the body of GET /logs, as clients read it; writeLogs writes it
// record by record rather than through encoding/json, which builds the whole answer
// in one buffer first (as large again as the records, and more while it grows).
type logsResponse struct {
	// Records are the most recent matching records, oldest first.
	Records []json.RawMessage `json:"records"`
	Count   int               `json:"count"`
	// Truncated says older matching records were left out by the limit.
	Truncated bool `json:"truncated"`
	// UnreadableWorkers, in a query over every worker, are those whose logs could not
	// be read (a damaged directory): left out, so that one worker's damage does not
	// hide everyone's logs. Why is in unreadable and in the collector's log.
	UnreadableWorkers []string `json:"unreadable_workers,omitempty"`
}

// queryResult is what a query found: the records of a logsResponse and why workers
// were left out.
type queryResult struct {
	records           []matchedRecord // oldest first
	truncated         bool
	unreadableWorkers []string
	unreadable        []error // why, one for each of unreadableWorkers
}

// query runs q over the store: the most recent q.limit matches by record time (file
// order within a worker, the order of ids across workers on equal times) that fit in
// q.maxBytes. One heap keeps them for all workers, so that a query holds at most
// q.maxBytes of records (and one record more while it decides which to drop) however
// many workers it reads.
// It stops with ctx's error once ctx is done (the caller gone).
func (s *store) query(ctx context.Context, q logQuery) (queryResult, error) {
	ids := []string{q.worker}
	if q.worker == "" {
		var err error
		if ids, err = s.workerIDs(); err != nil {
			return queryResult{}, err
		}
	}
	left := map[int]error{} // workers left out of a query over every worker, and why
	for {
		res, err := s.collect(ctx, q, ids, left)
		if !errors.Is(err, errQueryAgain) {
			return res, err
		}
	}
}

// errQueryAgain: a worker failed midway through its files after its records had
// displaced others'; collect is run again without it.
var errQueryAgain = errors.New("query again without a worker that could not be read")

// collect is a query over ids less those in left, adding to left those it cannot read
// (in a query over every worker).
func (s *store) collect(ctx context.Context, q logQuery, ids []string, left map[int]error) (queryResult, error) {
	var (
		res    queryResult
		recent recordHeap // top: the oldest kept
		held   int        // bytes of the records kept
		// floor is the most recent record dropped: every record kept is more recent
		// and every record at or before it is dropped, so that what is returned is
		// all the matches after some point (a small old record does not stay where a
		// larger, more recent one did not fit).
		floor    matchedRecord
		hasFloor bool
		// changes counts records dropped from recent and raises of the floor: a
		// worker that fails during its scan is taken out by removing its records only
		// if it changed neither.
		changes int
		// spare is the bytes of the record dropped last, for the next one kept: a
		// query over every worker keeps and drops its budget many times over, and
		// that garbage, not what is kept, would set the heap's peak.
		spare []byte
	)
	drop := func(m matchedRecord) {
		if !hasFloor || byTimeThenSeq(m, floor) > 0 {
			floor, hasFloor = matchedRecord{time: m.time, worker: m.worker, seq: m.seq}, true
			changes++
		}
		res.truncated = true
	}
	for i, id := range ids {
		if _, out := left[i]; out {
			continue
		}
		w, err := s.existing(id)
		if err != nil {
			if ctx.Err() != nil {
				return queryResult{}, ctx.Err()
			}
			if q.worker == "" {
				left[i] = err
				continue
			}
			return queryResult{}, err
		}
		if w == nil {
			if q.worker == "" {
				continue // a gone worker's directory, trimmed since it was listed
			}
			return queryResult{}, fmt.Errorf("%w: %s", errUnknownWorker, id)
		}
		// The most recent matches by record time, not by place in the file (an old
		// agent process's last flush can land after its successor's records).
		var (
			last time.Time // of the match before: a record without a time keeps its place after it
			seq  int       // file order, for records of equal time
		)
		changesBefore := changes
		err = w.scan(ctx, func(line []byte) {
			t, ok := q.match(line)
			if !ok {
				return
			}
			if t.IsZero() {
				t = last
			}
			last, seq = t, seq+1
			m := matchedRecord{time: t, worker: i, seq: seq}
			full := len(recent) > 0 && (len(recent) >= q.limit || held+len(line) > q.maxBytes)
			if hasFloor && byTimeThenSeq(m, floor) <= 0 || full && byTimeThenSeq(m, recent[0]) < 0 {
				drop(m) // older than what is kept, and no room: not worth a copy
				return
			}
			if len(line) <= cap(spare) && cap(spare) <= 2*len(line) {
				m.raw, spare = append(spare[:0], line...), nil
			} else {
				m.raw = slices.Clone(line)
			}
			heap.Push(&recent, m)
			held += cap(m.raw)
			for len(recent) > 1 && (len(recent) > q.limit || held > q.maxBytes) {
				old := heap.Pop(&recent).(matchedRecord)
				held -= cap(old.raw)
				changes++
				drop(old)
				spare = old.raw
			}
		})
		if err != nil {
			if ctx.Err() != nil {
				return queryResult{}, ctx.Err()
			}
			if q.worker != "" {
				return queryResult{}, err
			}
			left[i] = fmt.Errorf("read logs of worker %s: %w", id, err)
			if changes != changesBefore {
				return queryResult{}, errQueryAgain
			}
			recent = slices.DeleteFunc(recent, func(m matchedRecord) bool { return m.worker == i })
			heap.Init(&recent)
			held = 0
			for _, m := range recent {
				held += cap(m.raw)
			}
		}
	}
	for i, id := range ids {
		if err, out := left[i]; out {
			res.unreadableWorkers = append(res.unreadableWorkers, id)
			res.unreadable = append(res.unreadable, err)
		}
	}
	res.records = recent
	slices.SortFunc(res.records, byTimeThenSeq)
	return res, nil
}

// writeLogs writes res to w as a logsResponse, in the bytes encoding/json would write
// (records compacted and HTML-escaped, a final newline), but a record at a time:
// encoding/json builds the whole answer in one buffer first, which while it grows
// holds up to three times the records. A record encoding/json would refuse (gjson,
// which matched it, is laxer) is left out and not counted, where it failed the whole
// answer before.
func writeLogs(w io.Writer, res queryResult) error {
	bw := bufio.NewWriterSize(w, 32<<10)
	bw.WriteString(`{"records":[`)
	var compact bytes.Buffer // one record at a time
	count := 0
	for _, m := range res.records {
		compact.Reset()
		if json.Compact(&compact, m.raw) != nil {
			continue
		}
		if count > 0 {
			bw.WriteByte(',')
		}
		writeHTMLEscaped(bw, compact.Bytes())
		count++
	}
	tail, err := json.Marshal(struct {
		Count             int      `json:"count"`
		Truncated         bool     `json:"truncated"`
		UnreadableWorkers []string `json:"unreadable_workers,omitempty"`
	}{count, res.truncated, res.unreadableWorkers})
	if err != nil {
		return err
	}
	bw.WriteString("],")
	bw.Write(tail[1:]) // without its '{'
	bw.WriteByte('\n')
	return bw.Flush() // a bufio.Writer keeps its first error
}

// writeHTMLEscaped writes src, compact JSON, with <, > and & written as \u003c, \u003e
// and \u0026, and U+2028 and U+2029 as \u2028 and \u2029, as json.HTMLEscape does
// (and encoding/json with a json.RawMessage), without a copy of src.
func writeHTMLEscaped(w *bufio.Writer, src []byte) {
	const hex = "0123456789abcdef"
	start := 0
	for i := 0; i < len(src); i++ {
		switch c := src[i]; {
		case c == '<' || c == '>' || c == '&':
			w.Write(src[start:i])
			w.WriteString(`\u00`)
			w.WriteByte(hex[c>>4])
			w.WriteByte(hex[c&0xf])
			start = i + 1
		case c == 0xe2 && i+2 < len(src) && src[i+1] == 0x80 && src[i+2]&^1 == 0xa8: // U+2028, U+2029
			w.Write(src[start:i])
			w.WriteString(`\u202`)
			w.WriteByte(hex[src[i+2]&0xf])
			i += 2
			start = i + 1
		}
	}
	w.Write(src[start:])
}
