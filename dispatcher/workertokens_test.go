package dispatcher

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/smartroute/smartroute/proto/credential"
	"github.com/smartroute/smartroute/proto/frame"
	pb "github.com/smartroute/smartroute/proto/smartroutev1"
)

// A worker token the tokens file binds to worker ids opens /worker-listen only under
// those ids: a holder of it cannot connect under another worker's id, which would
// replace that worker's connection (its agent gives up on REPLACED) and take its
// place. Unbound tokens serve any id, as before. A reload that narrows a binding closes
// the connections it no longer covers.
func TestBoundWorkerTokenServesOnlyItsIDs(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "worker-tokens")
	writeFile(t, file, "# fleet\nfleet-token\n\ngpu-token worker-id=gpu-1  worker-id=gpu-pool-*\n")
	b := setup(t, Config{WorkerTokensFile: file})
	b.workerToken = "fleet-token"
	cpu := b.dial("cpu-1", "m")
	cpuConn := b.registered("cpu-1")
	b.workerToken = "gpu-token"
	gpu1 := b.dial("gpu-1", "g")
	b.dial("gpu-pool-7", "g")

	// The bound token under another worker's id, or an id outside its prefix: 403 before
	// the upgrade, and cpu-1 keeps its connection.
	for _, id := range []string{"cpu-1", "gpu-2", "gpu-poo"} {
		_, resp, err := b.dialWith(id, "Bearer gpu-token")
		if err == nil || resp == nil || resp.StatusCode != 403 {
			t.Fatalf("gpu-token as %s: err %v resp %v, want 403", id, err, resp)
		}
	}
	if b.registered("cpu-1") != cpuConn {
		t.Fatal("cpu-1's connection was replaced")
	}
	ans := b.postAsync(`{"task_type":"x","label":"m"}`)
	cpu.finish(cpu.assignment(), true, "{}")
	if got := <-ans; got.status != 200 || got.body["worker_id"] != "cpu-1" {
		t.Fatalf("task for cpu-1's label: %v", got)
	}
	// An unbound token serves any id, a bound one's too.
	b.workerToken = "fleet-token"
	b.dial("gpu-3", "g")

	// Narrowed to the pool: gpu-1 is closed with UNAUTHORIZED, gpu-pool-7 stays.
	gpu1Conn := b.registered("gpu-1")
	writeFile(t, file, "fleet-token\ngpu-token worker-id=gpu-pool-*\n")
	if err := b.d.ReloadCredentials(); err != nil {
		t.Fatal(err)
	}
	if code, text := gpu1.closeCode(); code != int(pb.CloseCode_CLOSE_CODE_UNAUTHORIZED) || !strings.Contains(text, "worker id") {
		t.Fatalf("gpu-1 after its binding went: closed with %d %q", code, text)
	}
	b.awaitGone(gpu1Conn)
	if ids := b.workers(); strings.Join(ids, " ") != "cpu-1 gpu-3 gpu-pool-7" {
		t.Fatalf("workers after the reload: %v", ids)
	}
}

// The tokens file's binding syntax: refusals name the line, never the secret, and a
// file refused on reload leaves the tokens in force.
func TestWorkerTokensFileBindings(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, content, want string }{
		{"plain", "tok-1\n  tok-2  \r\n# c\n", ""},
		{"bound", "tok-1 worker-id=a worker-id=b*\ntok-1 worker-id=c\ntok-2 worker-id=*\n", ""},
		{"comments after tokens", "tok#1 # any id\ntok-2 worker-id=a #worker-id=b\n", ""},
		{"a space in a token", "tok-1\nsecret part\n", "line 2: after the token"},
		{"an empty id", "secret worker-id=\n", "line 1: worker-id is required"},
		{"an id with a control byte", "secret worker-id=a\x01\n", "line 1: worker-id may hold only"},
		{"bound, then unbound", "secret worker-id=a\n\nsecret\n", "line 3: its token is bound to worker ids on line 1"},
		{"unbound, then bound", "secret\nsecret worker-id=a\n", "line 2: its token is also on line 1 without"},
	} {
		file := filepath.Join(t.TempDir(), "worker-tokens")
		writeFile(t, file, tc.content)
		_, err := loadWorkerTokens(nil, file)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		case err != nil && strings.Contains(err.Error(), "secret"):
			t.Errorf("%s: the error quotes the secret: %v", tc.name, err)
		}
	}
	file := filepath.Join(t.TempDir(), "worker-tokens")
	writeFile(t, file, "tok#1 # any id\ntok-2 worker-id=a worker-id=b-* #worker-id=c\n")
	w, err := loadWorkerTokens(nil, file)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		token, id string
		want      bool
	}{{"tok#1", "c", true}, {"tok-2", "a", true}, {"tok-2", "b-1", true}, {"tok-2", "b", false}, {"tok-2", "c", false}, {"tok-2", "aa", false}} {
		if h := credential.Sum(c.token); !w.set.Holds(h) || w.serves(h, c.id) != c.want {
			t.Errorf("%s as %s: held %v, serves %v, want %v", c.token, c.id, w.set.Holds(h), w.serves(h, c.id), c.want)
		}
	}
	writeFile(t, file, "secret worker-id=a\n")
	if _, err := loadWorkerTokens([]string{"secret"}, file); err == nil || !strings.Contains(err.Error(), "also in WorkerTokens") {
		t.Errorf("a token in WorkerTokens and bound in the file: %v", err)
	}
	if _, err := loadWorkerTokens([]string{"static"}, filepath.Join(t.TempDir(), "none")); err == nil {
		t.Error("a missing file: no error")
	}

	// A refused reload keeps the binding in force.
	writeFile(t, file, "gpu-token worker-id=gpu-1\n")
	b := setup(t, Config{WorkerTokensFile: file})
	writeFile(t, file, "gpu-token worker-id=gpu-1\ngpu-token\n")
	if err := b.d.ReloadCredentials(); err == nil {
		t.Fatal("reload of a token bound and unbound: accepted")
	}
	if _, resp, err := b.dialWith("gpu-2", "Bearer gpu-token"); err == nil || resp == nil || resp.StatusCode != 403 {
		t.Fatalf("gpu-token as gpu-2 after the refused reload: err %v resp %v, want 403", err, resp)
	}
}

// A worker tokens file of any content is read or refused with an error naming its line
// (TestWorkerTokensFileBindings checks that no secret is quoted), and what is read
// holds only tokens and ids that pass the checks the rest of the dispatcher relies on.
func FuzzParseWorkerTokens(f *testing.F) {
	f.Add([]byte("tok-1 worker-id=a worker-id=b*\n# c\ntok-2 # note\n"))
	f.Add([]byte("tok-1 worker-id=*\r\n\n  tok-2  \n"))
	f.Add([]byte("tok worker-id=\xff\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		lines, err := parseWorkerTokens(data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "line ") {
				t.Fatalf("error %q names no line", err)
			}
			return
		}
		for _, tl := range lines {
			if credential.Check(tl.secret) != nil {
				t.Fatalf("line %d: token %q read though Check refuses it", tl.n, tl.secret)
			}
			for _, id := range tl.ids {
				if id != "*" && frame.CheckWorkerIDField("worker-id", strings.TrimSuffix(id, "*")) != nil {
					t.Fatalf("line %d: worker id %q read though it is no worker id", tl.n, id)
				}
			}
		}
	})
}
