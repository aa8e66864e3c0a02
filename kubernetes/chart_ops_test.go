package kubernetes

import (
	"os"
	"os/exec"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/strvals"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// README's token rotation, step by step: every component that reads the tokens only
// at start restarts when they change. The collector reads INGEST_TOKEN from the
// Secret as an env var; without a restart it refused every rotated agent's logs.
func TestTokenRotationRestartsTheCollectorAndTheWorkers(t *testing.T) {
	steps := []map[string]any{
		{"auth": map[string]any{"workerToken": "old-token", "apiKeys": []any{"k"}}},
		{"auth": map[string]any{"workerToken": "old-token", "extraWorkerTokens": []any{"new-token"}, "apiKeys": []any{"k"}}},
		{"auth": map[string]any{"workerToken": "new-token", "extraWorkerTokens": []any{"old-token"}, "apiKeys": []any{"k"}}},
		{"auth": map[string]any{"workerToken": "new-token", "apiKeys": []any{"k"}}},
	}
	var collector corev1.PodTemplateSpec
	var workers corev1.PodTemplateSpec
	for i, v := range steps {
		r := mustRender(t, v, modelsValues)
		c := one[*appsv1.StatefulSet](t, r, "sr-smartroute-log-collector").Spec.Template
		w := one[*appsv1.Deployment](t, r, "sr-smartroute-worker").Spec.Template
		if i > 0 && reflect.DeepEqual(collector, c) {
			t.Errorf("step %d: the accepted tokens changed but the log collector's pod template did not", i)
		}
		if i > 0 && reflect.DeepEqual(workers, w) {
			t.Errorf("step %d: the accepted tokens changed but the workers' pod template did not", i)
		}
		collector, workers = c, w
	}
}

// README's GPU install as a shell passes it to Helm, every --set of it and nothing else:
// the quoting must keep the escaped dots (or Helm nests the keys and the schema refuses
// the values), and the values must be enough to render (a model repository above all).
func TestREADMEGPUInstallRenders(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	const cmd = "helm install smartroute kubernetes/chart/smartroute"
	_, rest, ok := strings.Cut(string(b), "\n"+cmd+" ")
	if !ok {
		t.Fatalf("no %q in README.md", cmd)
	}
	var args strings.Builder
	for line := range strings.Lines(rest) {
		args.WriteString(line)
		if !strings.HasSuffix(strings.TrimRight(line, "\n"), "\\") {
			break
		}
	}
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash to expand the command")
	}
	out, err := exec.Command("bash", "-c", "printf '%s\\0' "+args.String()).Output()
	if err != nil {
		t.Fatal(err)
	}
	words := strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
	vals := map[string]any{}
	for i := 0; i < len(words); i += 2 {
		if i+1 == len(words) {
			t.Fatalf("README's install ends with %q and no value", words[i])
		}
		switch flag, v := words[i], words[i+1]; flag {
		case "--set":
			err = strvals.ParseInto(v, vals)
		case "--set-string":
			err = strvals.ParseIntoString(v, vals)
		default:
			t.Fatalf("README's install passes %s, which this test does not read", flag)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	r, err := render(t, vals)
	if err != nil {
		t.Fatalf("README's install reaches Helm as %q and fails: %v", words, err)
	}
	w := one[*appsv1.Deployment](t, r, "sr-smartroute-worker")
	if sel := w.Spec.Template.Spec.NodeSelector; sel["nvidia.com/gpu.present"] != "true" {
		t.Errorf("node selector %v", sel)
	}
	for _, v := range w.Spec.Template.Spec.Volumes {
		if v.Name == "models" && (v.PersistentVolumeClaim == nil || v.PersistentVolumeClaim.ClaimName != "models") {
			t.Errorf("README's install mounts %+v as the model repository, want the claim models", v.VolumeSource)
		}
	}
}

// Triton gets SIGTERM only after its preStop wait, so it serves the agent's drain;
// the wait must end within the pod's grace period.
func TestTritonPreStopOutlastsTheDrain(t *testing.T) {
	r := mustRender(t, nil, modelsValues)
	var triton *corev1.Container
	containers := one[*appsv1.Deployment](t, r, "sr-smartroute-worker").Spec.Template.Spec.Containers
	for i := range containers {
		if containers[i].Name == "triton" {
			triton = &containers[i]
		}
	}
	if triton == nil || triton.Lifecycle == nil || triton.Lifecycle.PreStop == nil || triton.Lifecycle.PreStop.Exec == nil ||
		strings.Join(triton.Lifecycle.PreStop.Exec.Command, " ") != "sleep 35" {
		t.Fatalf("triton container's preStop: %+v", triton)
	}
	_, err := render(t, map[string]any{"workers": map[string]any{"triton": map[string]any{"preStopSeconds": 45}}}, modelsValues)
	if err == nil || !strings.Contains(err.Error(), "preStopSeconds must be below") {
		t.Errorf("preStop as long as the grace period: %v", err)
	}
}

// NOTES' curl commands work as printed: with TLS the dispatcher's certificate names its
// Service, so every https URL dials the Service's name (--resolve points it at the node
// or at the port-forward), or curl refuses the certificate.
func TestChartNotesCurlVerifiesTheDispatcherCertificate(t *testing.T) {
	clusterIP := map[string]any{"dispatcher": map[string]any{"service": map[string]any{"type": "ClusterIP"}}}
	url := regexp.MustCompile(`https?://([^/:\s]+)(:\d+)?/health`)
	for _, tc := range []struct {
		name      string
		overrides map[string]any
		files     []string
		want      string
	}{
		{"NodePort with TLS", nil, []string{allOnValues},
			"curl --cacert ca.crt --resolve sr-smartroute-dispatcher:30080:<node-ip> https://sr-smartroute-dispatcher:30080/health"},
		{"ClusterIP with TLS", clusterIP, []string{allOnValues},
			"curl --cacert ca.crt --resolve sr-smartroute-dispatcher:8080:127.0.0.1 https://sr-smartroute-dispatcher:8080/health"},
		{"NodePort without TLS", nil, []string{kindValues}, "curl http://<node-ip>:30080/health"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			notes := mustRender(t, tc.overrides, tc.files...).notes
			if !strings.Contains(notes, tc.want) {
				t.Errorf("NOTES lack %q:\n%s", tc.want, notes)
			}
			for _, l := range strings.Split(notes, "\n") {
				for _, m := range url.FindAllStringSubmatch(l, -1) {
					if strings.HasPrefix(m[0], "https:") && m[1] != "sr-smartroute-dispatcher" {
						t.Errorf("NOTES curl %q: the certificate names sr-smartroute-dispatcher, not %s", l, m[1])
					}
				}
			}
		})
	}
}

// With the defaults (backend triton) and no model repository, /models would be an empty
// emptyDir that nothing can fill: no worker ever Ready, helm install --wait timing out.
// The render fails instead, naming the values that give Triton its models.
func TestChartTritonNeedsAModelRepository(t *testing.T) {
	_, err := render(t, nil)
	for _, want := range []string{"workers.modelRepository.existingClaim", "workers.triton.extraArgs", "workers.backend=sim"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("default values: render error %v, want one naming %s", err, want)
		}
	}
	// A repository of Triton's own (object storage) needs no claim, in either flag form.
	for _, args := range [][]any{{"--model-repository=s3://bucket/models"}, {"--model-repository", "gs://bucket/models"}} {
		mustRender(t, map[string]any{"workers": map[string]any{"triton": map[string]any{"extraArgs": args}}})
	}
	// Another Triton flag is no model repository.
	if _, err := render(t, map[string]any{"workers": map[string]any{"triton": map[string]any{
		"extraArgs": []any{"--model-load-thread-count=2"}}}}); err == nil {
		t.Error("rendered with no model repository, only --model-load-thread-count")
	}
	w := one[*appsv1.Deployment](t, mustRender(t, nil, modelsValues), "sr-smartroute-worker")
	for _, v := range w.Spec.Template.Spec.Volumes {
		if v.Name == "models" && (v.PersistentVolumeClaim == nil || v.PersistentVolumeClaim.ClaimName != "models" || !v.PersistentVolumeClaim.ReadOnly) {
			t.Errorf("models volume %+v, want the claim models, read-only", v.VolumeSource)
		}
	}
}

// NOTES say where the chart's credentials are: the API key first, which every producer
// needs on /run-task. Not with the user's own Secret (its keys are theirs), nor with
// insecureNoAuth (nothing checks them).
func TestChartNotesNameTheAPIKey(t *testing.T) {
	apiKey := `kubectl get secret sr-smartroute-auth -o jsonpath='{.data.api-keys}' | base64 -d`
	for _, tc := range []struct {
		name      string
		overrides map[string]any
		want      bool
	}{
		{"generated", nil, true},
		{"existing Secret", map[string]any{"auth": map[string]any{"existingSecret": "mine"}}, false},
		{"insecureNoAuth", map[string]any{"auth": map[string]any{"insecureNoAuth": true}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			notes := mustRender(t, tc.overrides, kindValues).notes
			if strings.Contains(notes, apiKey) != tc.want || strings.Contains(notes, "{.data.worker-token}") != tc.want {
				t.Errorf("NOTES name the API key and worker token: %v, want %v:\n%s", !tc.want, tc.want, notes)
			}
		})
	}
}
