package dispatcher

import (
	"net/url"
	"strings"
	"testing"
)

func TestParseWorkersQuery(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]string{
		"": "false", "detail=true": "true", "detail=1": "true", "detail=false": "false", "detail=0": "false",
		"detail=maybe": "must be true or false", "detail=true&detail=false": "2 times", "details=true": "unknown parameter",
		// Not parsed in part: the bad pair would be dropped and the rest answered.
		"detail=%zz": "query string:", "detail=true;x=1": "query string:",
	} {
		detail, err := parseWorkersQuery(raw)
		got := map[bool]string{true: "true", false: "false"}[detail]
		if err != nil {
			got = err.Error()
		}
		if !strings.Contains(got, want) {
			t.Errorf("%q: got %q, want %q", raw, got, want)
		}
	}
}

func TestTaskAndWorkersQueriesOverHTTP(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	for path, want := range map[string]int{
		"/tasks/" + strings.Repeat("x", maxIDLength+1): 400,
		"/tasks/" + strings.Repeat("x", maxIDLength):   404,
		"/tasks/a%01b":             400,
		"/workers?detail=yes":      400,
		"/workers?colour=red":      400,
		"/workers?detail=1":        200,
		"/workers?detail=1&detail": 400,
		"/workers?detail=%zz":      400,
	} {
		if code, v := b.get(path); code != want {
			t.Errorf("%s: %d %v, want %d", path, code, v, want)
		}
	}
}

// FuzzParseWorkersQuery: no query string panics the parser; an accepted one names
// only detail, once.
func FuzzParseWorkersQuery(f *testing.F) {
	for _, s := range []string{"", "detail=true", "detail=0", "detail=true&detail=1", "x=1", "detail=%zz", "detail", ";;&&=", "detail=tru%65"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		detail, err := parseWorkersQuery(raw)
		if err != nil {
			return
		}
		q, err := url.ParseQuery(raw)
		if err != nil {
			t.Fatalf("accepted %q, which does not parse", raw)
		}
		if len(q) > 1 || len(q["detail"]) > 1 || (detail != (q.Get("detail") == "true" || q.Get("detail") == "1")) {
			t.Fatalf("accepted %q as detail=%v", raw, detail)
		}
	})
}

// FuzzParseDrainQuery: no query string panics the parser; an accepted one parses and
// names only reason, once.
func FuzzParseDrainQuery(f *testing.F) {
	for _, s := range []string{"", "reason=node+maintenance", "reason=%ff", "reason=%zz", "reason=a;b", "reason=a&reason=b", "x=1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		reason, err := parseDrainQuery(raw)
		if err != nil {
			return
		}
		q, err := url.ParseQuery(raw)
		if err != nil || len(q) > 1 || len(q["reason"]) > 1 || reason != q.Get("reason") {
			t.Fatalf("accepted %q as reason %q", raw, reason)
		}
	})
}

// FuzzParseTaskID: no id panics the check; an accepted id is printable, bounded and
// unchanged.
func FuzzParseTaskID(f *testing.F) {
	for _, s := range []string{"t1", "", "a b", "\x00", strings.Repeat("x", maxIDLength+1), "ü", "%2F"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		id, err := parseTaskID(raw)
		if err != nil {
			return
		}
		if id != raw || len(id) == 0 || len(id) > maxIDLength || strings.ContainsFunc(id, func(r rune) bool { return r <= ' ' || r > '~' }) {
			t.Fatalf("accepted id %q", raw)
		}
	})
}
