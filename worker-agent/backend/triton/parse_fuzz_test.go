package triton

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/smartroute/smartroute/proto/frame"
)

// Triton's repository index is input from another process (or a proxy in front of
// it): whatever it holds, decodeIndex refuses it or returns the array's entries, and
// what the worker announces of it (indexNames, indexLoaded) is each label named by
// the index, once, in index order, every one of them a label the dispatcher takes.
func FuzzDecodeIndex(f *testing.F) {
	for _, s := range []string{
		`[]`, `null`, `[{"name":"a"},{"name":"b","version":"1","state":"READY","reason":""},{"name":"b","version":"2","state":"UNLOADING"}]`,
		`[{"name":""},{"name":"` + strings.Repeat("m", 257) + `","state":"READY"}]`, `[null,{"name":"\u00e9","state":"READY"}]`,
		`[{"name":"m","version":1}]`, `{"models":[]}`, `[{"name":"\xff","state":"READY"}]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		entries, err := decodeIndex(body)
		if err != nil {
			if entries != nil || err.Error() == "" {
				t.Fatalf("%v with error %q", entries, err)
			}
			return
		}
		if entries == nil {
			t.Fatal("no error and no entries")
		}
		check := func(what string, got []string, pick func(indexEntry) bool) {
			var want []string
			seen := map[string]bool{}
			for _, e := range entries {
				if pick(e) && frame.CheckLabel("l", e.Name) == nil && !seen[e.Name] {
					seen[e.Name] = true
					want = append(want, e.Name)
				}
			}
			if strings.Join(got, "\x00") != strings.Join(want, "\x00") || len(got) != len(want) {
				t.Fatalf("%s = %q, want %q", what, got, want)
			}
			if err := frame.CheckLabels(what, got); err != nil {
				t.Fatal(err)
			}
			for _, l := range got {
				if !utf8.ValidString(l) {
					t.Fatalf("%s lists %q, not UTF-8", what, l)
				}
			}
		}
		check("indexNames", indexNames(entries), func(indexEntry) bool { return true })
		check("indexLoaded", indexLoaded(entries), func(e indexEntry) bool { return e.State == "READY" })
		for _, e := range entries {
			s := heldState(entries, e.Name)
			if s == "" {
				continue
			}
			found := false
			for _, o := range entries {
				found = found || o.Name == e.Name && o.State == s
			}
			if !found || s == "UNAVAILABLE" {
				t.Fatalf("heldState(%q) = %q", e.Name, s)
			}
		}
	})
}

// Triton's error answer may be anything (a proxy's page, any encoding, any status):
// its message is never empty, and always UTF-8.
func FuzzErrorMessage(f *testing.F) {
	for _, s := range []string{`{"error":"load failed"}`, ``, " \n", "caf\xe9", "{\"error\":\"\xff\"}", `{"error":""}`, `{"error":5}`} {
		f.Add(400, []byte(s))
		f.Add(599, []byte(s))
	}
	f.Fuzz(func(t *testing.T, code int, raw []byte) {
		m := errorMessage(code, raw)
		if m == "" || !utf8.ValidString(m) {
			t.Fatalf("errorMessage(%d, %q) = %q", code, raw, m)
		}
	})
}
