package kubernetes

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	"helm.sh/helm/v3/pkg/releaseutil"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

const (
	chartDir    = "chart/smartroute"
	allOnValues = "ci/values-all-on.yaml"
	// The defaults plus a model repository, which a Triton install cannot do without:
	// what the tests render (and .ci/run lints) as the default values.
	modelsValues = "ci/values-models.yaml"
	kindValues   = "kind-cfg/values-kind.yaml"
	release      = "sr"
	kubeVersion  = "1.33.0"
)

// rendered is one chart rendering: every manifest decoded into its typed object.
type rendered struct {
	objects []any
	notes   string // NOTES.txt as helm install prints it
}

// render renders the chart as `helm template` would, for the values files given (later ones
// win) and the --set style overrides, validating the values against values.schema.json.
func render(t testing.TB, overrides map[string]any, valueFiles ...string) (*rendered, error) {
	t.Helper()
	c, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	vals, err := mergedValues(valueFiles, overrides)
	if err != nil {
		t.Fatal(err)
	}
	return renderChart(t, c, vals)
}

func mergedValues(valueFiles []string, overrides map[string]any) (map[string]any, error) {
	vals := map[string]any{}
	for _, f := range valueFiles {
		v, err := chartutil.ReadValuesFile(f)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", f, err)
		}
		vals = chartutil.CoalesceTables(v.AsMap(), vals)
	}
	return chartutil.CoalesceTables(overrides, vals), nil
}

func renderChart(t testing.TB, c *chart.Chart, vals map[string]any) (*rendered, error) {
	t.Helper()
	// A current cluster's version (Helm's default, 1.20, predates the chart's kubeVersion).
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = chartutil.KubeVersion{Version: "v" + kubeVersion, Major: "1", Minor: "33"}
	if !chartutil.IsCompatibleRange(c.Metadata.KubeVersion, caps.KubeVersion.String()) {
		t.Fatalf("Chart.yaml kubeVersion %q excludes %s", c.Metadata.KubeVersion, kubeVersion)
	}
	top, err := chartutil.ToRenderValues(c, vals,
		chartutil.ReleaseOptions{Name: release, Namespace: "smartroute", IsInstall: true, Revision: 1}, caps)
	if err != nil {
		return nil, err
	}
	files, err := engine.Render(c, top)
	if err != nil {
		return nil, err
	}
	r := &rendered{notes: files[c.Name()+"/templates/NOTES.txt"]}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		if !strings.HasSuffix(name, ".yaml") || strings.TrimSpace(files[name]) == "" {
			continue // NOTES.txt, helpers, templates switched off
		}
		docs := releaseutil.SplitManifests(files[name])
		keys := slices.Collect(maps.Keys(docs))
		sort.Sort(releaseutil.BySplitManifestsOrder(keys))
		for _, key := range keys {
			obj, err := decodeStrict([]byte(docs[key]))
			if err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			r.objects = append(r.objects, obj)
		}
	}
	return r, nil
}

// ServiceMonitor and ScaledObject are CRDs: these structs hold exactly the fields the chart
// writes (their published Go types would pull in the operators' dependency trees), so a
// misspelt field still fails the strict decode. Field names follow
// monitoring.coreos.com/v1 and keda.sh/v1alpha1.
type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector  metav1.LabelSelector `json:"selector"`
		Endpoints []struct {
			Port      string `json:"port"`
			Path      string `json:"path"`
			Interval  string `json:"interval"`
			Scheme    string `json:"scheme,omitempty"`
			TLSConfig *struct {
				ServerName string `json:"serverName,omitempty"`
				CA         struct {
					Secret *corev1.SecretKeySelector `json:"secret,omitempty"`
				} `json:"ca"`
			} `json:"tlsConfig,omitempty"`
			Authorization *struct {
				Type        string                    `json:"type"`
				Credentials *corev1.SecretKeySelector `json:"credentials"`
			} `json:"authorization,omitempty"`
		} `json:"endpoints"`
	} `json:"spec"`
}

type scaledObject struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		ScaleTargetRef struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Name       string `json:"name"`
		} `json:"scaleTargetRef"`
		MinReplicaCount *int32 `json:"minReplicaCount"`
		MaxReplicaCount *int32 `json:"maxReplicaCount"`
		PollingInterval *int32 `json:"pollingInterval"`
		CooldownPeriod  *int32 `json:"cooldownPeriod"`
		Advanced        *struct {
			HorizontalPodAutoscalerConfig *struct {
				Behavior *autoscalingv2.HorizontalPodAutoscalerBehavior `json:"behavior"`
			} `json:"horizontalPodAutoscalerConfig"`
		} `json:"advanced"`
		Triggers []struct {
			Type     string            `json:"type"`
			Metadata map[string]string `json:"metadata"`
		} `json:"triggers"`
	} `json:"spec"`
}

// newObject returns an empty typed object for apiVersion and kind; every kind the chart
// renders must be here.
func newObject(apiVersion, kind string) (any, bool) {
	switch apiVersion + "/" + kind {
	case "v1/ServiceAccount":
		return &corev1.ServiceAccount{}, true
	case "v1/Secret":
		return &corev1.Secret{}, true
	case "v1/ConfigMap":
		return &corev1.ConfigMap{}, true
	case "v1/Service":
		return &corev1.Service{}, true
	case "v1/PersistentVolumeClaim":
		return &corev1.PersistentVolumeClaim{}, true
	case "apps/v1/Deployment":
		return &appsv1.Deployment{}, true
	case "apps/v1/StatefulSet":
		return &appsv1.StatefulSet{}, true
	case "networking.k8s.io/v1/NetworkPolicy":
		return &networkingv1.NetworkPolicy{}, true
	case "policy/v1/PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}, true
	case "autoscaling/v2/HorizontalPodAutoscaler":
		return &autoscalingv2.HorizontalPodAutoscaler{}, true
	case "monitoring.coreos.com/v1/ServiceMonitor":
		return &serviceMonitor{}, true
	case "keda.sh/v1alpha1/ScaledObject":
		return &scaledObject{}, true
	case "monitoring.coreos.com/v1/PrometheusRule":
		return &prometheusRule{}, true
	}
	return nil, false
}

// decodeStrict decodes one manifest into its API type, failing on an unknown, duplicated or
// wrongly cased field, as the API server's strict field validation does (encoding/json alone
// would accept "nodeport" for nodePort).
func decodeStrict(doc []byte) (any, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return nil, fmt.Errorf("not a manifest: %w\n%s", err, doc)
	}
	obj, ok := newObject(tm.APIVersion, tm.Kind)
	if !ok {
		return nil, fmt.Errorf("no API type known for apiVersion %q kind %q", tm.APIVersion, tm.Kind)
	}
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return nil, fmt.Errorf("%s/%s: %w\n%s", tm.APIVersion, tm.Kind, err, doc)
	}
	strictErrs, err := k8sjson.UnmarshalStrict(js, obj, k8sjson.DisallowDuplicateFields, k8sjson.DisallowUnknownFields)
	if err := errors.Join(append(strictErrs, err)...); err != nil {
		return nil, fmt.Errorf("%s/%s: %w\n%s", tm.APIVersion, tm.Kind, err, doc)
	}
	return obj, nil
}

// find returns the rendered objects of type T.
func find[T any](r *rendered) []T {
	var out []T
	for _, o := range r.objects {
		if v, ok := o.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

func one[T any](t *testing.T, r *rendered, name string) T {
	t.Helper()
	for _, o := range find[T](r) {
		if m, ok := any(o).(metav1.Object); ok && m.GetName() == name {
			return o
		}
	}
	var zero T
	t.Fatalf("no %T named %q rendered", zero, name)
	return zero
}

func mustRender(t *testing.T, overrides map[string]any, valueFiles ...string) *rendered {
	t.Helper()
	r, err := render(t, overrides, valueFiles...)
	if err != nil {
		t.Fatalf("render %v: %v", valueFiles, err)
	}
	return r
}

// podSpecs returns every pod template rendered, by workload name.
func podSpecs(r *rendered) map[string]corev1.PodSpec {
	pods := map[string]corev1.PodSpec{}
	for _, d := range find[*appsv1.Deployment](r) {
		pods[d.Name] = d.Spec.Template.Spec
	}
	for _, s := range find[*appsv1.StatefulSet](r) {
		pods[s.Name] = s.Spec.Template.Spec
	}
	return pods
}

// checkPods asserts what every pod of every values file must hold: non-root, read-only root
// filesystem, no capabilities, RuntimeDefault seccomp, probes and resources everywhere.
func checkPods(t *testing.T, r *rendered) {
	t.Helper()
	pods := podSpecs(r)
	if len(pods) == 0 {
		t.Fatal("no workloads rendered")
	}
	for name, p := range pods {
		psc := p.SecurityContext
		if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
			t.Errorf("%s: pod securityContext.runAsNonRoot is not true", name)
		}
		if psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("%s: pod seccompProfile is not RuntimeDefault", name)
		}
		if p.AutomountServiceAccountToken == nil || *p.AutomountServiceAccountToken {
			t.Errorf("%s: the service account token is mounted; no pod needs the API", name)
		}
		for _, c := range p.Containers {
			where := name + "/" + c.Name
			sc := c.SecurityContext
			switch {
			case sc == nil:
				t.Errorf("%s: no securityContext", where)
				continue
			case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
				t.Errorf("%s: root filesystem is writable", where)
			case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
				t.Errorf("%s: privilege escalation allowed", where)
			case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}):
				t.Errorf("%s: capabilities not dropped: %+v", where, sc.Capabilities)
			case sc.RunAsUser != nil && *sc.RunAsUser == 0:
				t.Errorf("%s: runs as root", where)
			}
			if c.LivenessProbe == nil || c.ReadinessProbe == nil {
				t.Errorf("%s: liveness or readiness probe missing", where)
			}
			if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
				t.Errorf("%s: cpu/memory requests or memory limit missing: %+v", where, c.Resources)
			}
		}
	}
}

func container(t *testing.T, p corev1.PodSpec, name string) corev1.Container {
	t.Helper()
	for _, c := range p.Containers {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %q", name)
	return corev1.Container{}
}

func env(c corev1.Container) map[string]corev1.EnvVar {
	m := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		m[e.Name] = e
	}
	return m
}

func TestChartDefaultValues(t *testing.T) {
	r := mustRender(t, nil, modelsValues)
	checkPods(t, r)

	d := one[*appsv1.Deployment](t, r, "sr-smartroute-dispatcher")
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 1 {
		t.Errorf("dispatcher replicas = %v, want exactly 1 (routing state is in one process)", d.Spec.Replicas)
	}
	if d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		t.Errorf("dispatcher strategy = %q, want Recreate", d.Spec.Strategy.Type)
	}
	de := env(container(t, d.Spec.Template.Spec, "dispatcher"))
	if de["ADDR"].Value != "0.0.0.0:8080" {
		t.Errorf("dispatcher ADDR = %q, want 0.0.0.0:8080", de["ADDR"].Value)
	}
	if _, ok := de["INSECURE_NO_AUTH"]; ok {
		t.Error("default values run the dispatcher with INSECURE_NO_AUTH")
	}
	if de["WORKER_TOKENS_FILE"].Value == "" || de["API_KEYS_FILE"].Value == "" || de["DATA_DIR"].Value != "/data" || de["JOURNAL_LOCK_TIMEOUT"].Value != "60s" {
		t.Errorf("dispatcher env lacks the tokens file or the data dir: %v", de)
	}
	var dataClaim string
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Name == "data" && v.PersistentVolumeClaim != nil {
			dataClaim = v.PersistentVolumeClaim.ClaimName
		}
	}
	one[*corev1.PersistentVolumeClaim](t, r, dataClaim)

	svc := one[*corev1.Service](t, r, "sr-smartroute-dispatcher")
	if svc.Spec.Type != corev1.ServiceTypeClusterIP {
		t.Errorf("dispatcher service type = %q, want ClusterIP by default", svc.Spec.Type)
	}

	w := one[*appsv1.Deployment](t, r, "sr-smartroute-worker")
	wp := w.Spec.Template.Spec
	agent, triton := container(t, wp, "agent"), container(t, wp, "triton")
	if agent.LivenessProbe.HTTPGet == nil || agent.LivenessProbe.HTTPGet.Path != "/healthz" ||
		agent.LivenessProbe.HTTPGet.Port.String() != "metrics" {
		t.Errorf("agent liveness = %+v, want the agent's own /healthz", agent.LivenessProbe.ProbeHandler)
	}
	if agent.ReadinessProbe.HTTPGet == nil || agent.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("agent readiness = %+v, want /readyz", agent.ReadinessProbe.ProbeHandler)
	}
	// Triton's strict /v2/health/ready is false during every model load and unload: the
	// pod would flap NotReady with each label load (TRITON.md).
	if triton.ReadinessProbe.HTTPGet == nil || triton.ReadinessProbe.HTTPGet.Path != "/v2/health/live" {
		t.Errorf("triton readiness = %+v, want /v2/health/live", triton.ReadinessProbe.ProbeHandler)
	}
	for _, c := range []corev1.Container{agent} {
		for _, p := range []*corev1.Probe{c.LivenessProbe, c.StartupProbe} {
			if p != nil && p.HTTPGet != nil && (strings.HasPrefix(p.HTTPGet.Path, "/v2/") || p.HTTPGet.Port.String() == "triton-http") {
				t.Errorf("the agent's liveness depends on Triton: %+v", p.HTTPGet)
			}
		}
	}
	if !slices.Contains(triton.Args, "--model-control-mode=explicit") {
		t.Errorf("triton args %q lack explicit model control", triton.Args)
	}
	if gpu := triton.Resources.Limits["nvidia.com/gpu"]; gpu.Value() != 1 {
		t.Errorf("triton GPU limit = %v, want 1 by default", gpu.String())
	}
	ae := env(agent)
	if ae["WORKER_ID"].ValueFrom == nil || ae["WORKER_ID"].ValueFrom.FieldRef == nil ||
		ae["WORKER_ID"].ValueFrom.FieldRef.FieldPath != "metadata.name" {
		t.Errorf("WORKER_ID is not the pod name: %+v", ae["WORKER_ID"])
	}
	if ae["WORKER_TOKEN"].ValueFrom == nil || ae["WORKER_TOKEN"].ValueFrom.SecretKeyRef == nil {
		t.Errorf("WORKER_TOKEN is not from the Secret: %+v", ae["WORKER_TOKEN"])
	}
	if got, want := ae["DISPATCHER_URL"].Value, "ws://sr-smartroute-dispatcher:8080/worker-listen"; got != want {
		t.Errorf("DISPATCHER_URL = %q, want %q", got, want)
	}
	if got := ae["LOG_COLLECTOR_URL"].Value; got != "ws://sr-smartroute-log-collector:8090/ingest" {
		t.Errorf("LOG_COLLECTOR_URL = %q", got)
	}
	if ae["BACKEND"].Value != "triton" || ae["TRITON_URL"].Value != "http://127.0.0.1:8000" {
		t.Errorf("agent backend env = %v / %v", ae["BACKEND"], ae["TRITON_URL"])
	}
	// The agent waits for Triton as long as the startup probe does, not its own 5m default.
	if got := ae["TRITON_START_TIMEOUT"].Value; got != "600s" {
		t.Errorf("TRITON_START_TIMEOUT = %q, want 600s (workers.triton.startupSeconds)", got)
	}
	if got := ae["INVENTORY_INTERVAL"].Value; got != "30s" {
		t.Errorf("INVENTORY_INTERVAL = %q, want 30s (workers.modelRepository.inventorySeconds)", got)
	}
	if ru := w.Spec.Strategy.RollingUpdate; w.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType || ru == nil ||
		ru.MaxSurge.String() != "1" || ru.MaxUnavailable.String() != "0" {
		t.Errorf("worker strategy = %+v, want a rolling update adding a worker before removing one", w.Spec.Strategy)
	}

	pdb := one[*policyv1.PodDisruptionBudget](t, r, "sr-smartroute-worker")
	if !metav1LabelsEqual(pdb.Spec.Selector, w.Spec.Selector) {
		t.Errorf("PDB selector %v does not select the workers (%v)", pdb.Spec.Selector, w.Spec.Selector)
	}
	// Workers are unready while the dispatcher is down; the default policy would then
	// block every node drain.
	if p := pdb.Spec.UnhealthyPodEvictionPolicy; p == nil || *p != policyv1.AlwaysAllow {
		t.Errorf("PDB unhealthyPodEvictionPolicy = %v, want AlwaysAllow", p)
	}

	sec := one[*corev1.Secret](t, r, "sr-smartroute-auth")
	tok := sec.StringData["worker-token"]
	if len(tok) < 32 || !strings.Contains(sec.StringData["worker-tokens"], tok) || sec.StringData["ingest-tokens"] != tok {
		t.Errorf("generated worker token %q too short or not among the accepted tokens: %v", tok, sec.StringData)
	}
	// Both sides need a credential, or the dispatcher refuses to bind beyond loopback.
	if key := sec.StringData["api-keys"]; len(key) < 32 || key == tok {
		t.Errorf("generated API key %q too short or equal to the worker token", key)
	}
	ce := env(container(t, one[*appsv1.StatefulSet](t, r, "sr-smartroute-log-collector").Spec.Template.Spec, "log-collector"))
	// A bound over all workers' files: pod names change with every rollout.
	if got := ce["MAX_TOTAL_BYTES"].Value; got != "8589934592" {
		t.Errorf("collector MAX_TOTAL_BYTES = %q, want 8 GiB (under the 10Gi claim)", got)
	}
	if ce["INGEST_TOKEN"].ValueFrom == nil || ce["INGEST_TOKEN"].ValueFrom.SecretKeyRef.Key != "ingest-tokens" {
		t.Errorf("collector INGEST_TOKEN = %+v, want the Secret's ingest-tokens", ce["INGEST_TOKEN"])
	}

	coll := one[*appsv1.StatefulSet](t, r, "sr-smartroute-log-collector")
	if len(coll.Spec.VolumeClaimTemplates) != 1 {
		t.Errorf("log collector has %d claim templates, want 1", len(coll.Spec.VolumeClaimTemplates))
	}
	if n := len(find[*serviceMonitor](r)) + len(find[*scaledObject](r)) + len(find[*autoscalingv2.HorizontalPodAutoscaler](r)) +
		len(find[*corev1.ConfigMap](r)) + len(find[*prometheusRule](r)); n != 0 {
		t.Errorf("%d optional objects (ServiceMonitor, autoscaler, dashboard, alerts) rendered by default", n)
	}
}

func metav1LabelsEqual(a, b *metav1.LabelSelector) bool {
	return a != nil && b != nil && maps.Equal(a.MatchLabels, b.MatchLabels)
}

func TestChartAllOn(t *testing.T) {
	r := mustRender(t, nil, allOnValues)
	checkPods(t, r)

	sm := find[*serviceMonitor](r)
	if len(sm) != 1 || len(sm[0].Spec.Endpoints) != 3 || sm[0].Spec.Endpoints[0].Authorization == nil {
		t.Fatalf("ServiceMonitor = %+v, want one with the http, logs and metrics endpoints and authorization", sm)
	}
	// Prometheus dials pod IPs: each https endpoint must name the certificate's Service.
	for _, e := range sm[0].Spec.Endpoints {
		if e.Scheme == "https" && (e.TLSConfig == nil || e.TLSConfig.ServerName == "") {
			t.Errorf("ServiceMonitor endpoint %q scrapes https without tlsConfig.serverName", e.Port)
		}
	}
	// The ServiceMonitor's selector must pick the dispatcher, the collector and the workers.
	selected := 0
	for _, s := range find[*corev1.Service](r) {
		match := true
		for k, v := range sm[0].Spec.Selector.MatchLabels {
			match = match && s.Labels[k] == v
		}
		if match {
			selected++
		}
	}
	if selected != 3 {
		t.Errorf("ServiceMonitor selects %d Services, want 3", selected)
	}

	so := find[*scaledObject](r)
	if len(so) != 1 || so[0].Spec.ScaleTargetRef.Name != "sr-smartroute-worker" ||
		len(so[0].Spec.Triggers) != 1 || !strings.Contains(so[0].Spec.Triggers[0].Metadata["query"], "smartroute_dispatcher_queued_tasks_total") {
		t.Fatalf("ScaledObject = %+v, want one scaling the workers on smartroute_dispatcher_queued_tasks_total", so)
	}
	w := one[*appsv1.Deployment](t, r, "sr-smartroute-worker")
	if w.Spec.Replicas != nil {
		t.Errorf("worker replicas = %d with autoscaling on; the autoscaler owns it", *w.Spec.Replicas)
	}
	d := one[*appsv1.Deployment](t, r, "sr-smartroute-dispatcher")
	if *d.Spec.Replicas != 1 {
		t.Errorf("dispatcher replicas = %d, want 1", *d.Spec.Replicas)
	}
	if got := d.Spec.Template.Spec.Containers[0].LivenessProbe.HTTPGet.Scheme; got != corev1.URISchemeHTTPS {
		t.Errorf("dispatcher probe scheme with TLS = %q, want HTTPS", got)
	}
	ae := env(container(t, w.Spec.Template.Spec, "agent"))
	if !strings.HasPrefix(ae["DISPATCHER_URL"].Value, "wss://") || ae["CA_FILE"].Value == "" {
		t.Errorf("with TLS the agent has DISPATCHER_URL %q and CA_FILE %q", ae["DISPATCHER_URL"].Value, ae["CA_FILE"].Value)
	}
	if img := container(t, w.Spec.Template.Spec, "agent").Image; img != "registry.example.com/smartroute/smartroute/worker-agent:1.2.3" {
		t.Errorf("agent image = %q", img)
	}
	svc := one[*corev1.Service](t, r, "sr-smartroute-dispatcher")
	if svc.Spec.Type != corev1.ServiceTypeNodePort || svc.Spec.Ports[0].NodePort != 30080 {
		t.Errorf("dispatcher service = %s port %d, want NodePort 30080", svc.Spec.Type, svc.Spec.Ports[0].NodePort)
	}
	sec := one[*corev1.Secret](t, r, "sr-smartroute-auth")
	if sec.StringData["api-keys"] != "ci-producer-key-1\nci-producer-key-2" ||
		sec.StringData["worker-tokens"] != "ci-worker-token\nci-next-worker-token" ||
		sec.StringData["ingest-tokens"] != "ci-worker-token,ci-next-worker-token" {
		t.Errorf("auth secret = %v", sec.StringData)
	}
	checkDashboard(t, one[*corev1.ConfigMap](t, r, "sr-smartroute-dashboard"))
	checkAlerts(t, one[*prometheusRule](t, r, "sr-smartroute"), true)
}

// The HPA flavour of autoscaling (the all-on values use KEDA).
func TestChartHPAAutoscaling(t *testing.T) {
	r := mustRender(t, map[string]any{"workers": map[string]any{"autoscaling": map[string]any{"type": "hpa"}}}, allOnValues)
	if n := len(find[*scaledObject](r)); n != 0 {
		t.Errorf("%d ScaledObjects with type hpa", n)
	}
	h := one[*autoscalingv2.HorizontalPodAutoscaler](t, r, "sr-smartroute-worker")
	if len(h.Spec.Metrics) != 1 || h.Spec.Metrics[0].External == nil ||
		h.Spec.Metrics[0].External.Metric.Name != "smartroute_dispatcher_queued_tasks_total" {
		t.Errorf("HPA metrics = %+v", h.Spec.Metrics)
	}
	if h.Spec.MinReplicas == nil || *h.Spec.MinReplicas != 2 || h.Spec.MaxReplicas != 20 {
		t.Errorf("HPA bounds = %v..%d, want 2..20", h.Spec.MinReplicas, h.Spec.MaxReplicas)
	}
}

// The values task start installs on kind: simulated backend, no Triton, NodePort 30080.
func TestChartKindValues(t *testing.T) {
	r := mustRender(t, nil, kindValues)
	checkPods(t, r)
	w := one[*appsv1.Deployment](t, r, "sr-smartroute-worker")
	if n := len(w.Spec.Template.Spec.Containers); n != 1 {
		t.Errorf("kind worker pods have %d containers, want the agent alone", n)
	}
	ae := env(container(t, w.Spec.Template.Spec, "agent"))
	if got := ae["BACKEND"].Value; got != "sim" {
		t.Errorf("kind BACKEND = %q, want sim", got)
	}
	for _, name := range []string{"TRITON_START_TIMEOUT", "INVENTORY_INTERVAL"} {
		if v, ok := ae[name]; ok {
			t.Errorf("sim backend gets %s %q", name, v.Value)
		}
	}
	svc := one[*corev1.Service](t, r, "sr-smartroute-dispatcher")
	if svc.Spec.Type != corev1.ServiceTypeNodePort || svc.Spec.Ports[0].NodePort != 30080 {
		t.Errorf("kind dispatcher service = %s/%d, want NodePort 30080", svc.Spec.Type, svc.Spec.Ports[0].NodePort)
	}
	var cluster struct {
		Nodes []struct {
			ExtraPortMappings []struct {
				ContainerPort int `json:"containerPort"`
				HostPort      int `json:"hostPort"`
			} `json:"extraPortMappings"`
		} `json:"nodes"`
	}
	b, err := os.ReadFile("kind-cfg/cluster.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &cluster); err != nil {
		t.Fatal(err)
	}
	if len(cluster.Nodes) == 0 || len(cluster.Nodes[0].ExtraPortMappings) == 0 ||
		cluster.Nodes[0].ExtraPortMappings[0].ContainerPort != 30080 || cluster.Nodes[0].ExtraPortMappings[0].HostPort != 30080 {
		t.Errorf("kind cluster does not map NodePort 30080 to the host: %+v", cluster)
	}
}

// Bad values fail with an error that names the field, and render nothing.
func TestChartRejectsBadValues(t *testing.T) {
	for _, tc := range []struct {
		name      string
		overrides map[string]any
		want      string
	}{
		{"unknown field", map[string]any{"dispatcher": map[string]any{"replicas": 3}}, "replicas"},
		{"wrong type", map[string]any{"workers": map[string]any{"maxLabels": "two"}}, "maxLabels"},
		{"out of range", map[string]any{"dispatcher": map[string]any{"service": map[string]any{"nodePort": 80}}}, "nodePort"},
		{"unknown backend", map[string]any{"workers": map[string]any{"backend": "onnx"}}, "backend"},
		{"triton backend without triton", map[string]any{"workers": map[string]any{"triton": map[string]any{"enabled": false}}}, "workers.triton.enabled"},
		{"tls without certificate", map[string]any{"tls": map[string]any{"enabled": true}}, "Secret is required when tls.enabled"},
		{"rollout that can never start", map[string]any{"workers": map[string]any{"updateStrategy": map[string]any{"maxSurge": 0, "maxUnavailable": "0%"}}}, "workers.updateStrategy"},
		{"bad maxSurge", map[string]any{"workers": map[string]any{"updateStrategy": map[string]any{"maxSurge": "one"}}}, "maxSurge"},
		{"unknown eviction policy", map[string]any{"workers": map[string]any{"podDisruptionBudget": map[string]any{"unhealthyPodEvictionPolicy": "Never"}}}, "unhealthyPodEvictionPolicy"},
		{"opsAuth scraped without a key", map[string]any{"auth": map[string]any{"opsAuth": true},
			"metrics":       map[string]any{"serviceMonitor": map[string]any{"enabled": true}},
			"networkPolicy": map[string]any{"metricsFrom": []any{map[string]any{"podSelector": map[string]any{}}}}}, "metrics.serviceMonitor.authorization"},
		// The collector's /metrics shares its port with /logs: the NetworkPolicy must
		// be told who scrapes, or every collector scrape would be dropped.
		{"collector scraped through a NetworkPolicy that admits no scraper", map[string]any{
			"metrics": map[string]any{"serviceMonitor": map[string]any{"enabled": true}}}, "networkPolicy.metricsFrom"},
		{"misspelt NetworkPolicy peer", map[string]any{"networkPolicy": map[string]any{
			"logReaders": []any{map[string]any{"podSelectr": map[string]any{}}}}}, "podSelectr"},
		{"empty NetworkPolicy peer", map[string]any{"networkPolicy": map[string]any{
			"metricsFrom": []any{map[string]any{}}}}, "metricsFrom"},
		// The collector reads INGEST_TOKEN comma-separated: a comma would split a token,
		// and its agents' log streams would be refused while the dispatcher takes them.
		{"comma in the worker token", map[string]any{"auth": map[string]any{"workerToken": "fleet-a,2025"}}, "workerToken"},
		{"comma in an extra worker token", map[string]any{"auth": map[string]any{"extraWorkerTokens": []any{"x,y"}}}, "extraWorkerTokens"},
		// The dispatcher would refuse it at start and crash-loop.
		{"space in an API key", map[string]any{"auth": map[string]any{"apiKeys": []any{"key 1"}}}, "apiKeys"},
		// The dispatcher's tokens and keys files read a line starting with '#' as a
		// comment: every worker, or every producer, would be refused.
		{"worker token starting with #", map[string]any{"auth": map[string]any{"workerToken": "#fleet-a"}}, "workerToken"},
		{"extra worker token starting with #", map[string]any{"auth": map[string]any{"extraWorkerTokens": []any{"#old"}}}, "extraWorkerTokens"},
		{"API key starting with #", map[string]any{"auth": map[string]any{"apiKeys": []any{"#prodkey"}}}, "apiKeys"},
		// Scalers the cluster would refuse.
		{"keda min above max", map[string]any{"workers": map[string]any{"autoscaling": map[string]any{
			"enabled": true, "type": "keda", "minReplicas": 5, "maxReplicas": 2}}}, "workers.autoscaling.minReplicas (5)"},
		{"hpa min above max", map[string]any{"workers": map[string]any{"autoscaling": map[string]any{
			"enabled": true, "type": "hpa", "minReplicas": 5, "maxReplicas": 2}}}, "workers.autoscaling.minReplicas (5)"},
		{"bad PDB maxUnavailable", map[string]any{"workers": map[string]any{"podDisruptionBudget": map[string]any{"maxUnavailable": "abc"}}}, "maxUnavailable"},
		// What --set (not --set-string) makes of nvidia.com/gpu.present=true.
		{"boolean nodeSelector value", map[string]any{"workers": map[string]any{"nodeSelector": map[string]any{"nvidia.com/gpu.present": true}}}, "nodeSelector"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := render(t, tc.overrides, modelsValues)
			if err == nil {
				t.Fatalf("rendered %d objects, want an error naming %q", len(r.objects), tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not name %q", err, tc.want)
			}
		})
	}
}

// Every visible ASCII character but the comma is allowed in worker tokens (the
// collector splits on commas), and every one in API keys; '#' only past the first.
func TestChartAcceptsPunctuationInSecrets(t *testing.T) {
	punct := "!\"#$%&'()*+-./:;<=>?@[\\]^_`{|}~"
	mustRender(t, map[string]any{"auth": map[string]any{"workerToken": "t" + punct,
		"extraWorkerTokens": []any{punct}, "apiKeys": []any{punct + ","}}}, modelsValues)
}

// The README's GPU install: --set-string workers.nodeSelector.nvidia\.com/gpu\.present=true.
func TestChartGPUNodeSelector(t *testing.T) {
	r := mustRender(t, map[string]any{"workers": map[string]any{"nodeSelector": map[string]any{"nvidia.com/gpu.present": "true"}}}, modelsValues)
	w := one[*appsv1.Deployment](t, r, "sr-smartroute-worker")
	if got := w.Spec.Template.Spec.NodeSelector; got["nvidia.com/gpu.present"] != "true" {
		t.Errorf("worker nodeSelector = %v, want nvidia.com/gpu.present: \"true\"", got)
	}
}

// A slower Triton start reaches the agent's wait too, not only the startup probe.
func TestChartTritonStartTimeout(t *testing.T) {
	r := mustRender(t, map[string]any{"workers": map[string]any{"triton": map[string]any{"startupSeconds": 1200}}}, modelsValues)
	w := one[*appsv1.Deployment](t, r, "sr-smartroute-worker")
	if got := env(container(t, w.Spec.Template.Spec, "agent"))["TRITON_START_TIMEOUT"].Value; got != "1200s" {
		t.Errorf("TRITON_START_TIMEOUT = %q, want 1200s", got)
	}
	if p := container(t, w.Spec.Template.Spec, "triton").StartupProbe; p == nil || p.FailureThreshold*p.PeriodSeconds != 1200 {
		t.Errorf("triton startup probe = %+v, want 1200s in all", p)
	}
}

// A saturated GPU pool: no surge pod (it would stay Pending), one worker replaced at a time;
// percentages pass through as the Deployment API takes them.
func TestChartWorkerUpdateStrategy(t *testing.T) {
	for _, tc := range []struct{ surge, unavailable any }{{0, 1}, {"25%", "25%"}} {
		r := mustRender(t, map[string]any{"workers": map[string]any{
			"updateStrategy": map[string]any{"maxSurge": tc.surge, "maxUnavailable": tc.unavailable}}}, modelsValues)
		w := one[*appsv1.Deployment](t, r, "sr-smartroute-worker")
		ru := w.Spec.Strategy.RollingUpdate
		if ru == nil || ru.MaxSurge.String() != fmt.Sprint(tc.surge) || ru.MaxUnavailable.String() != fmt.Sprint(tc.unavailable) {
			t.Errorf("worker rollingUpdate = %+v, want maxSurge %v, maxUnavailable %v", ru, tc.surge, tc.unavailable)
		}
	}
}

// A values file with a typo, as a user would pass with -f.
func TestChartRejectsBadValuesFile(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("workers:\n  replica: 3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := render(t, nil, modelsValues, bad); err == nil || !strings.Contains(err.Error(), "replica") {
		t.Fatalf("render with a misspelt field: %v, want an error naming it", err)
	}
}

// The strict decoder is what makes the render test worth anything: a misspelt field must fail.
func TestDecodeStrictRejectsUnknownFields(t *testing.T) {
	for _, doc := range []string{
		"apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {replica: 1}\n",
		"apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {ports: [{port: 80, nodeport: 30080}]}\n",
		"apiVersion: v1\nkind: Service\nmetadata: {name: x, name: y}\n",
		"apiVersion: keda.sh/v1alpha1\nkind: ScaledObject\nmetadata: {name: x}\nspec: {minReplicas: 1}\n",
		"apiVersion: example.com/v1\nkind: Unknown\nmetadata: {name: x}\n",
	} {
		if _, err := decodeStrict([]byte(doc)); err == nil {
			t.Errorf("decoded without error:\n%s", doc)
		}
	}
}

// helm lint's own rules, in-process (.ci/run also runs the pinned helm CLI's lint).
func TestChartLint(t *testing.T) {
	for _, files := range [][]string{{modelsValues}, {allOnValues}, {kindValues}} {
		vals, err := mergedValues(files, nil)
		if err != nil {
			t.Fatal(err)
		}
		l := lint.All(chartDir, vals, "smartroute", false)
		for _, m := range l.Messages {
			if m.Severity > support.InfoSev {
				t.Errorf("lint %v: %s", files, m)
			}
		}
	}
}

var metricName = regexp.MustCompile(`smartroute_[a-z_]+`)

// checkDashboard asserts the dashboard is JSON Grafana can load and that it shows the hit
// rate, latency percentiles, queue depth and loads per label from the metrics that exist.
func checkDashboard(t *testing.T, cm *corev1.ConfigMap) {
	t.Helper()
	if cm.Labels["grafana_dashboard"] != "1" {
		t.Errorf("dashboard ConfigMap labels %v lack the sidecar's grafana_dashboard", cm.Labels)
	}
	var dash struct {
		UID        string `json:"uid"`
		Templating struct {
			List []struct {
				Name string `json:"name"`
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	dec := json.NewDecoder(strings.NewReader(cm.Data["smartroute.json"]))
	if err := dec.Decode(&dash); err != nil {
		t.Fatalf("dashboard is not JSON: %v", err)
	}
	known := map[string]bool{}
	for _, m := range strings.Fields(exportedMetrics) {
		known[m] = true
	}
	var exprs []string
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
			for _, m := range metricName.FindAllString(tg.Expr, -1) {
				if !known[strings.TrimSuffix(m, "_bucket")] {
					t.Errorf("panel %q queries %s, which no component exports", p.Title, m)
				}
			}
		}
	}
	// One release's series only: one Prometheus often scrapes installs in several
	// namespaces (staging and production), and unfiltered sums added them up.
	if !slices.ContainsFunc(dash.Templating.List, func(v struct {
		Name string `json:"name"`
	}) bool {
		return v.Name == "namespace"
	}) {
		t.Error("dashboard has no namespace variable")
	}
	for _, e := range exprs {
		if n, m := strings.Count(e, `namespace=~"$namespace"`), len(metricName.FindAllString(e, -1)); n != m {
			t.Errorf("dashboard query %q: %d of its %d series selected by namespace", e, n, m)
		}
	}
	all := strings.Join(exprs, "\n")
	for _, want := range []string{
		"smartroute_dispatcher_label_hits_total", "smartroute_dispatcher_label_loads_total", // hit rate, loads per label
		"histogram_quantile(0.99, sum by (le) (rate(smartroute_dispatcher_task_duration_seconds_bucket",
		"smartroute_dispatcher_queued_tasks_total", `sum by (label) (smartroute_dispatcher_queued_tasks{namespace=~"$namespace"})`,
	} {
		if !strings.Contains(all, want) {
			t.Errorf("dashboard has no query containing %q", want)
		}
	}
}

// The metric names the metrics code exports (the contract between the two; see README's
// metrics section).
const exportedMetrics = `
smartroute_dispatcher_tasks_received_total smartroute_dispatcher_tasks_completed_total
smartroute_dispatcher_tasks_failed_total smartroute_dispatcher_label_hits_total
smartroute_dispatcher_label_loads_total smartroute_dispatcher_evictions_total
smartroute_dispatcher_queue_wait_seconds smartroute_dispatcher_task_duration_seconds
smartroute_dispatcher_load_duration_seconds smartroute_dispatcher_queued_tasks
smartroute_dispatcher_queued_tasks_total smartroute_dispatcher_inflight_tasks
smartroute_dispatcher_connected_workers smartroute_dispatcher_worker_connects_total
smartroute_dispatcher_worker_disconnects_total smartroute_dispatcher_schedule_duration_seconds
smartroute_dispatcher_journal_write_errors_total smartroute_dispatcher_journal_unwritten_answers
smartroute_agent_label_loads_total smartroute_agent_load_duration_seconds
smartroute_agent_run_duration_seconds smartroute_agent_tasks_total
smartroute_agent_triton_errors_total smartroute_agent_log_records_dropped_total
smartroute_collector_batches_total smartroute_collector_records_total
smartroute_collector_duplicate_batches_total smartroute_collector_write_errors_total
smartroute_collector_budget_deleted_files_total smartroute_collector_connected_streams
smartroute_collector_batch_slot_waits_total`
