package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The dispatcher and two agents, each beside its own fake Triton process (Triton cannot
// run here; the fake follows shared/TRITON.md), answer infer and embed_texts tasks over
// Triton's real HTTP path, loading each label once.
func TestTritonBackend(t *testing.T) {
	t.Parallel()
	s := &stack{t: t, agents: map[string]*proc{}}
	s.startDispatcher(stackOpts{})
	logDir := t.TempDir()
	_, collectorAddr := startCollector(t, s, "triton", "", logDir)
	for i := 1; i <= 2; i++ {
		id := fmt.Sprintf("triton-agent-%d", i)
		tritonAddr := startFakeTriton(t, id, "--models", "label-a,label-b,label-c",
			"--load-delay", "50ms", "--unload-delay", "20ms", "--dim", "4")
		s.agents[id] = start(t, "worker-agent#"+id,
			"--dispatcher-url", "ws://"+s.addr+"/worker-listen", "--worker-id", id, "--max-labels", "2", "--log-level", "debug",
			"--backend", "triton", "--triton-url", "http://"+tritonAddr, "--triton-start-timeout", "20s",
			"--log-collector-url", "ws://"+collectorAddr+"/ingest")
	}
	s.waitWorkers(2)

	infer := `{"inputs":[{"name":"input_ids","shape":[1,3],"datatype":"INT64","data":[1,2,3]}],"outputs":[{"name":"sentence_embedding"}]}`
	misses := map[string]int{}
	for i := range 6 {
		label, taskType, params := "label-a", "infer", infer
		if i%2 == 1 {
			label, taskType, params = "label-b", "embed_texts", fmt.Sprintf(`{"texts":["text %d","another text"]}`, i)
		}
		body, _ := json.Marshal(map[string]string{
			"task_id": fmt.Sprintf("triton-%d", i), "task_type": taskType, "label": label, "parameters_json": params,
		})
		code, a := s.run(string(body))
		if code != 200 || a.Status != "completed" {
			t.Fatalf("task %d (%s on %s): %d %+v", i, taskType, label, code, a)
		}
		if a.LabelMiss {
			misses[label]++
		}
		var result struct {
			ModelName  string      `json:"model_name"`
			Embeddings [][]float32 `json:"embeddings"`
		}
		if err := json.Unmarshal(a.Result, &result); err != nil {
			t.Fatalf("task %d result %s: %v", i, a.Result, err)
		}
		switch taskType {
		case "infer":
			if result.ModelName != label {
				t.Fatalf("task %d: result %s is not Triton's answer from %s", i, a.Result, label)
			}
		case "embed_texts":
			if len(result.Embeddings) != 2 || len(result.Embeddings[0]) != 4 {
				t.Fatalf("task %d: result %s, want two embeddings of 4", i, a.Result)
			}
		}
	}
	if misses["label-a"] != 1 || misses["label-b"] != 1 {
		t.Fatalf("label misses %v, want one per label", misses)
	}
	total := 0
	for _, p := range s.agents {
		total += grepLog(t, p, `"event":"label_miss"`)
	}
	if total != 2 {
		t.Fatalf("agents logged %d label misses, want 2", total)
	}

	// An unknown task type is a clear task error, not a crash.
	code, a := s.run(task("triton-unknown", "label-a", ""))
	if a.Status != "failed" || !strings.Contains(a.Error, `unknown task type "sample_task"; the triton backend runs infer and embed_texts`) {
		t.Fatalf("sample_task on the triton backend: %d %+v, want a failed task", code, a)
	}
	t.Logf("unknown task type: %d %s", code, a.Error)

	// The collector holds each agent's label-miss and task-completed records: the
	// same number the agent printed, once the agents have drained and flushed.
	shipped := 0
	for id, p := range s.agents {
		p.signal(t, syscall.SIGTERM)
		if err := p.wait(t, 20*time.Second); err != nil {
			t.Fatalf("agent %s exit: %v", id, err)
		}
		lines := collectorLines(t, logDir, id)
		for _, event := range []string{`"event":"label_miss"`, `"event":"task_completed"`} {
			got, want := countWith(lines, event), grepLog(t, p, event)
			if got != want {
				t.Fatalf("agent %s: collector holds %d %s records, the agent printed %d", id, got, event, want)
			}
			shipped += got
		}
	}
	if shipped != 2+7 { // 2 label misses; 6 tasks and the unknown type completed
		t.Fatalf("collector holds %d label-miss and task-completed records, want 9", shipped)
	}
}

// A model uploaded to Triton's repository while the stack runs is routable without a
// restart: a task for it waits (no worker lists it yet, and the fleet has just
// changed), the agent's inventory check finds the new folder, tells the dispatcher,
// and the task runs on Triton's real HTTP path.
func TestTritonModelUploadedWhileRunning(t *testing.T) {
	t.Parallel()
	s := &stack{t: t, agents: map[string]*proc{}}
	s.startDispatcher(stackOpts{})
	repo := t.TempDir()
	tritonAddr := startFakeTriton(t, "upload", "--models", "label-a", "--repository", repo,
		"--load-delay", "20ms", "--unload-delay", "10ms", "--dim", "4")
	s.agents["upload"] = start(t, "worker-agent#upload",
		"--dispatcher-url", "ws://"+s.addr+"/worker-listen", "--worker-id", "upload", "--log-level", "debug",
		"--backend", "triton", "--triton-url", "http://"+tritonAddr, "--triton-start-timeout", "20s",
		"--inventory-interval", "100ms")
	s.waitWorkers(1)

	infer := `{"inputs":[{"name":"input_ids","shape":[1,3],"datatype":"INT64","data":[1,2,3]}],"outputs":[{"name":"sentence_embedding"}]}`
	body, _ := json.Marshal(map[string]any{"task_id": "uploaded-1", "task_type": "infer", "label": "label-new",
		"parameters_json": infer, "return_result": false, "timeout_ms": 60000})
	if code, a := s.run(string(body)); code != 202 {
		t.Fatalf("submit before the upload: %d %+v", code, a)
	}
	if err := os.Mkdir(filepath.Join(repo, "label-new"), 0o755); err != nil {
		t.Fatal(err)
	}
	var got taskAnswer
	s.eventually("the task for the uploaded model completed", func() bool {
		return s.getJSON("/tasks/uploaded-1", &got) == 200 && (got.Status == "completed" || got.Status == "failed")
	})
	var result struct {
		ModelName string `json:"model_name"`
	}
	if err := json.Unmarshal(got.Result, &result); got.Status != "completed" || err != nil || result.ModelName != "label-new" {
		t.Fatalf("task for the uploaded model: %+v, want Triton's answer from label-new", got)
	}
	if n := grepLog(t, s.agents["upload"], `"message":"backend's loadable labels changed"`, `"added":["label-new"]`, `"dispatcher_told":true`); n != 1 {
		t.Fatalf("agent logged the change %d times, want once", n)
	}
	if n := grepLog(t, s.disp, `"message":"worker's loadable labels changed"`); n != 1 {
		t.Fatalf("dispatcher logged the change %d times, want once", n)
	}
}

// startFakeTriton starts a fake Triton on a port of its choosing and returns its
// address, which it prints as "... serving on <addr>, models ...".
func startFakeTriton(t *testing.T, name string, args ...string) string {
	t.Helper()
	p := start(t, "fake-triton#"+name, append([]string{"--addr", "127.0.0.1:0"}, args...)...)
	return loggedAddr(t, p, func(line []byte) string {
		_, rest, ok := bytes.Cut(line, []byte(" serving on "))
		addr, _, ok2 := bytes.Cut(rest, []byte(", models "))
		if !ok || !ok2 {
			return ""
		}
		return string(addr)
	})
}
