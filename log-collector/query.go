package logcollector

import (
	"cmp"
	"container/heap"
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
	raw  json.RawMessage
	time time.Time
	seq  int // place among the worker's matches, in file order
}

func byTimeThenSeq(a, b matchedRecord) int {
	return cmp.Or(a.time.Compare(b.time), cmp.Compare(a.seq, b.seq))
}

// recordHeap keeps a worker's most recent matches: its top is the oldest.
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

// logsResponse is the body of GET /logs.
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
	unreadable        []error
}

// query runs q over the store: per worker the last q.limit matches in file order;
// across workers merged by record time.
// It stops with ctx's error once ctx is done (the caller gone).
func (s *store) query(ctx context.Context, q logQuery) (logsResponse, error) {
	ids := []string{q.worker}
	if q.worker == "" {
		var err error
		if ids, err = s.workerIDs(); err != nil {
			return logsResponse{}, err
		}
	}
	var (
		all       []matchedRecord
		truncated bool
		resp      logsResponse
	)
	skip := func(id string, err error) {
		resp.UnreadableWorkers = append(resp.UnreadableWorkers, id)
		resp.unreadable = append(resp.unreadable, err)
	}
	for _, id := range ids {
		w, err := s.existing(id)
		if err != nil {
			if ctx.Err() != nil {
				return logsResponse{}, ctx.Err()
			}
			if q.worker == "" {
				skip(id, err)
				continue
			}
			return logsResponse{}, err
		}
		if w == nil {
			if q.worker == "" {
				continue // a gone worker's directory, trimmed since it was listed
			}
			return logsResponse{}, fmt.Errorf("%w: %s", errUnknownWorker, id)
		}
		// The most recent matches by record time, not by place in the file (an old
		// agent process's last flush can land after its successor's records): a heap
		// whose top is the oldest kept, dropped while over limit or maxBytes.
		var (
			recent recordHeap
			held   int       // bytes of the records kept
			last   time.Time // of the match before: a record without a time keeps its place after it
			seq    int       // file order, for records of equal time
		)
		err = w.scan(ctx, func(line []byte) {
			t, ok := q.match(line)
			if !ok {
				return
			}
			if t.IsZero() {
				t = last
			}
			last, seq = t, seq+1
			heap.Push(&recent, matchedRecord{raw: json.RawMessage(slices.Clone(line)), time: t, seq: seq})
			held += len(line)
			for len(recent) > 1 && (len(recent) > q.limit || held > q.maxBytes) {
				held -= len(heap.Pop(&recent).(matchedRecord).raw)
				truncated = true
			}
		})
		if err != nil {
			if ctx.Err() != nil {
				return logsResponse{}, ctx.Err()
			}
			if q.worker == "" {
				skip(id, fmt.Errorf("read logs of worker %s: %w", id, err))
				continue
			}
			return logsResponse{}, err
		}
		ring := []matchedRecord(recent)
		slices.SortFunc(ring, byTimeThenSeq)
		if len(ids) == 1 {
			all = ring
			break
		}
		// Merge as we go and keep only the last limit: holding limit records of every
		// worker would grow with the number of workers ever seen.
		all = mergeByTime(all, ring)
		all = keepLast(all, q, &truncated)
	}
	// Within limit and maxBytes already: the scan kept one worker's, keepLast the merge.
	resp.Records, resp.Count, resp.Truncated = make([]json.RawMessage, len(all)), len(all), truncated
	for i, m := range all {
		resp.Records[i] = m.raw
	}
	return resp, nil
}

// keepLast drops the oldest records beyond q.limit or q.maxBytes (always keeping the
// newest), noting that in truncated.
func keepLast(all []matchedRecord, q logQuery, truncated *bool) []matchedRecord {
	held := 0
	for i := len(all) - 1; i >= 0; i-- {
		held += len(all[i].raw)
		if i < len(all)-1 && (len(all)-i > q.limit || held > q.maxBytes) {
			*truncated = true
			return all[i+1:]
		}
	}
	return all
}

func byTime(a, b matchedRecord) int { return a.time.Compare(b.time) }

// mergeByTime merges two lists sorted by time into a new one; on equal times a's
// records come first, as a stable sort of a followed by b would put them.
func mergeByTime(a, b []matchedRecord) []matchedRecord {
	out := make([]matchedRecord, 0, len(a)+len(b))
	for len(a) > 0 && len(b) > 0 {
		if byTime(b[0], a[0]) < 0 {
			out, b = append(out, b[0]), b[1:]
		} else {
			out, a = append(out, a[0]), a[1:]
		}
	}
	return append(append(out, a...), b...)
}
