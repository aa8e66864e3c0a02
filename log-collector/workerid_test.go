package logcollector

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/smartroute/smartroute/proto/frame"
	"github.com/smartroute/smartroute/worker-agent/logship"
)

// longIDs are worker ids the dispatcher and the agent take whose escaped form is too
// long for a directory name.
var longIDs = []string{
	strings.Repeat("w", frame.MaxWorkerIDBytes), // plain, 256 bytes
	"ns:" + strings.Repeat("p:", 80) + "pod-0",  // 168 bytes, each ':' escaped to %3A
	strings.Repeat("%", frame.MaxWorkerIDBytes), // escaped to 768 bytes
	strings.Repeat("a:", 120) + "one",           // these two share the prefix
	strings.Repeat("a:", 120) + "two",           // their names keep
}

// An agent takes any id frame.CheckWorkerID takes and checks none of the collector's
// own: the collector must store (and find again) the logs of every such id, or the
// agent's shipper is refused on every dial for as long as it runs.
func TestLongWorkerIDsShipAndAreFound(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	r := startCollector(t, Config{Dir: dir})
	for i, id := range longIDs {
		if err := frame.CheckWorkerID(id); err != nil {
			t.Fatalf("the agent refuses %q: %v", id, err)
		}
		s, err := logship.New(logship.Config{URL: r.ingestURL(), WorkerID: id})
		if err != nil {
			t.Fatal(err)
		}
		_, _ = fmt.Fprintf(s, `{"level":"info","message":"from %d"}`+"\n", i)
		if err := s.Close(); err != nil || s.Stats().Connects == 0 {
			t.Fatalf("worker id of %d bytes: Close = %v, connects %d", len(id), err, s.Stats().Connects)
		}
		if code, body := r.get("/logs?worker=" + url.QueryEscape(id)); code != 200 || !strings.Contains(string(body), fmt.Sprintf("from %d", i)) {
			t.Fatalf("logs of worker %q: %d %s", id, code, body)
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(longIDs) {
		t.Fatalf("%d directories for %d workers", len(entries), len(longIDs))
	}
	for _, e := range entries {
		if len(e.Name()) > maxNameBytes {
			t.Errorf("directory name of %d bytes: %s", len(e.Name()), e.Name())
		}
	}
	// A query over every worker lists them from their directories, also after a
	// restart: the names are hashed, and the ids come from their files.
	r.stop()
	r = startCollector(t, Config{Dir: dir})
	code, body := r.get("/logs")
	var resp logsResponse
	if err := json.Unmarshal(body, &resp); code != 200 || err != nil {
		t.Fatalf("logs of every worker: %d %v %s", code, err, body)
	}
	for i := range longIDs {
		if !slices.ContainsFunc(resp.Records, func(rec json.RawMessage) bool { return strings.Contains(string(rec), fmt.Sprintf("from %d", i)) }) {
			t.Errorf("the record of worker %d is missing from %s", i, body)
		}
	}
}

func TestWorkerDirName(t *testing.T) {
	t.Parallel()
	// The names of ids that fit are those of before: existing directories stay theirs.
	for id, want := range map[string]string{
		"worker-1":                          "worker-1",
		"w.2/x":                             "w.2%2Fx",
		".hidden":                           "%2Ehidden",
		"ns:pod~1":                          "ns%3Apod%7E1",
		strings.Repeat("w", maxNameBytes):   strings.Repeat("w", maxNameBytes),
		strings.Repeat(":", maxNameBytes/3): strings.Repeat("%3A", maxNameBytes/3),
	} {
		if got, hashed := workerDirName(id); got != want || hashed {
			t.Errorf("workerDirName(%q) = %q, %v; want %q", id, got, hashed, want)
		}
	}
	names := map[string]string{}
	for _, id := range append(slices.Clone(longIDs), strings.Repeat("w", maxNameBytes+1), strings.Repeat(":", maxNameBytes/3)+"w") {
		name, hashed := workerDirName(id)
		if !hashed || len(name) > maxNameBytes {
			t.Errorf("workerDirName(%q) = %q (%d bytes), %v", id, name, len(name), hashed)
		}
		if other, ok := names[name]; ok {
			t.Errorf("%q and %q share the name %q", id, other, name)
		}
		names[name] = id
	}
}

// FuzzWorkerDirName: every id the dispatcher takes gets a name that fits, and one
// that is not hashed is the escaped id, which workerIDs reads back.
func FuzzWorkerDirName(f *testing.F) {
	for _, id := range longIDs {
		f.Add(id)
	}
	f.Add("worker-1")
	for n := 204; n <= 207; n++ { // a %XX across the cut, or not
		f.Add(strings.Repeat("w", n) + "%" + strings.Repeat("w", 40))
	}
	f.Fuzz(func(t *testing.T, id string) {
		if frame.CheckWorkerID(id) != nil {
			return
		}
		name, hashed := workerDirName(id)
		if len(name) > maxNameBytes || name == "" {
			t.Fatalf("workerDirName(%q) = %q, %d bytes", id, name, len(name))
		}
		prefix, _, marked := strings.Cut(name, hashMark)
		if marked != hashed {
			t.Fatalf("workerDirName(%q) = %q, hashed %v", id, name, hashed)
		}
		back, err := url.PathUnescape(prefix)
		if err != nil || !strings.HasPrefix(id, back) || !hashed && back != id {
			t.Fatalf("workerDirName(%q) = %q: its prefix reads as %q, %v", id, name, back, err)
		}
	})
}

// A hashed directory made by a stream that did not get to write its worker-id file
// (a crash) is the worker's still: opening it writes the file. One whose file names
// another worker is refused, not mixed with this one's.
func TestHashedDirectoryIDFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	id, other := longIDs[3], longIDs[4]
	name, _ := workerDirName(id)
	if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name, "00000001.jsonl"), []byte(`{"message":"kept"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	otherName, _ := workerDirName(other)
	if err := os.Mkdir(filepath.Join(dir, otherName), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, otherName, idFile), []byte(id), 0o644); err != nil {
		t.Fatal(err)
	}
	r := startCollector(t, Config{Dir: dir})
	if code, body := r.get("/logs"); code != 200 || strings.Contains(string(body), "kept") {
		t.Fatalf("logs of every worker before the id file: %d %s", code, body)
	}
	if code, body := r.get("/logs?worker=" + url.QueryEscape(id)); code != 200 || !strings.Contains(string(body), "kept") {
		t.Fatalf("logs of the worker: %d %s", code, body)
	}
	if b, err := os.ReadFile(filepath.Join(dir, name, idFile)); err != nil || string(b) != id {
		t.Fatalf("id file: %q, %v", b, err)
	}
	if code, body := r.get("/logs"); code != 200 || !strings.Contains(string(body), "kept") || strings.Contains(string(body), "unreadable") {
		t.Fatalf("logs of every worker: %d %s", code, body)
	}
	if code, body := r.get("/logs?worker=" + url.QueryEscape(other)); code != 500 {
		t.Fatalf("logs of a worker whose directory names another: %d %s", code, body)
	}
}
