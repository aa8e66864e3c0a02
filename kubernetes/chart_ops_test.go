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
		r := mustRender(t, v)
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

// README's GPU install line as a shell passes it to Helm: the quoting must keep the
// escaped dots, or Helm nests the keys and the schema refuses the values.
func TestREADMEGPUInstallLineRenders(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*--set-string (.*nodeSelector.*)$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("no --set-string nodeSelector line in README.md")
	}
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash to expand the line")
	}
	out, err := exec.Command("bash", "-c", "printf %s "+string(m[1])).Output()
	if err != nil {
		t.Fatal(err)
	}
	vals := map[string]any{}
	if err := strvals.ParseIntoString(string(out), vals); err != nil {
		t.Fatal(err)
	}
	r, err := render(t, vals)
	if err != nil {
		t.Fatalf("README's %q reaches Helm as %q and fails: %v", m[1], out, err)
	}
	if sel := one[*appsv1.Deployment](t, r, "sr-smartroute-worker").Spec.Template.Spec.NodeSelector; sel["nvidia.com/gpu.present"] != "true" {
		t.Errorf("node selector %v", sel)
	}
}

// Triton gets SIGTERM only after its preStop wait, so it serves the agent's drain;
// the wait must end within the pod's grace period.
func TestTritonPreStopOutlastsTheDrain(t *testing.T) {
	r := mustRender(t, nil)
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
	_, err := render(t, map[string]any{"workers": map[string]any{"triton": map[string]any{"preStopSeconds": 45}}})
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
