package kubernetes

import (
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8slabels "k8s.io/apimachinery/pkg/labels"
)

// Found by a review of the chart against the binaries: each renders, and each would
// break or mislead a real install.

// Two installs of one release name in two namespaces, scraped by one Prometheus: each
// autoscaler must count its own dispatcher's queue, not the sum of both.
func TestChartKEDAQueryIsScopedToTheNamespace(t *testing.T) {
	r := mustRender(t, nil, allOnValues)
	so := find[*scaledObject](r)
	if len(so) != 1 || !strings.Contains(so[0].Spec.Triggers[0].Metadata["query"], `namespace="smartroute"`) {
		t.Fatalf("KEDA query %q, want it scoped to namespace smartroute", so[0].Spec.Triggers[0].Metadata["query"])
	}
}

// The scrape credential is a producer API key (the dispatcher has one key space): it
// goes to the dispatcher's endpoint only, not to the collector, nor in clear text to
// the agents' plain-HTTP port.
func TestChartScrapeCredentialGoesOnlyToTheDispatcher(t *testing.T) {
	r := mustRender(t, nil, allOnValues)
	sm := find[*serviceMonitor](r)
	if len(sm) != 1 {
		t.Fatalf("%d ServiceMonitors", len(sm))
	}
	for _, e := range sm[0].Spec.Endpoints {
		if got, want := e.Authorization != nil, e.Port == "http"; got != want {
			t.Errorf("endpoint %q: authorization %v, want %v", e.Port, got, want)
		}
	}
}

// Generated credentials: the pods' checksum must not hash a freshly drawn random token
// (each include drew another), or the first upgrade, with the same Secret, rolls every
// pod, the single Recreate dispatcher included, for nothing.
func TestChartAuthChecksumIsStableWithGeneratedCredentials(t *testing.T) {
	sum := func(r *rendered) map[string]string {
		out := map[string]string{}
		for _, d := range find[*appsv1.Deployment](r) {
			out[d.Name] = d.Spec.Template.Annotations["checksum/auth"]
		}
		for _, s := range find[*appsv1.StatefulSet](r) {
			out[s.Name] = s.Spec.Template.Annotations["checksum/auth"]
		}
		return out
	}
	a, b := sum(mustRender(t, nil, modelsValues)), sum(mustRender(t, nil, modelsValues))
	for name, h := range a {
		if h == "" || h != b[name] {
			t.Errorf("%s: checksum/auth %q, then %q with the same values", name, h, b[name])
		}
	}
	// A credential given in the values still rolls the pods when it changes.
	c := sum(mustRender(t, map[string]any{"auth": map[string]any{"workerToken": "rotated-token"}}, modelsValues))
	if c["sr-smartroute-worker"] == a["sr-smartroute-worker"] {
		t.Error("a new auth.workerToken leaves checksum/auth unchanged")
	}
}

// The dispatcher serves /health only once it holds the journal's lock, which it waits
// for up to the grace period and 15 s: the startup probe must outlast that, or the
// kubelet kills the replacement pod in the very wait the timeout is for.
func TestChartDispatcherStartupOutlastsTheJournalLockWait(t *testing.T) {
	for _, grace := range []int{45, 110, 600} {
		r := mustRender(t, map[string]any{"dispatcher": map[string]any{"terminationGracePeriodSeconds": grace}}, modelsValues)
		d := one[*appsv1.Deployment](t, r, "sr-smartroute-dispatcher")
		c := container(t, d.Spec.Template.Spec, "dispatcher")
		lock, err := time.ParseDuration(env(c)["JOURNAL_LOCK_TIMEOUT"].Value)
		if err != nil {
			t.Fatal(err)
		}
		p := c.StartupProbe
		if window := time.Duration(p.PeriodSeconds*p.FailureThreshold) * time.Second; window < lock+30*time.Second {
			t.Errorf("grace %ds: startup probe window %v, journal lock wait %v: want 30 s to spare for the replay", grace, window, lock)
		}
	}
}

// Names are the full name plus a suffix: a full name that leaves no room gets a clear
// error at render, not objects the API server refuses (a Service over 63 characters; a
// StatefulSet over 52, whose controller-revision-hash label would be over 63).
func TestChartRefusesAFullNameTooLongForItsObjects(t *testing.T) {
	if _, err := render(t, map[string]any{"fullnameOverride": strings.Repeat("x", 39)}, modelsValues); err == nil || !strings.Contains(err.Error(), "fullnameOverride") {
		t.Errorf("a 39-character full name: %v, want an error naming fullnameOverride", err)
	}
	mustRender(t, map[string]any{"fullnameOverride": strings.Repeat("x", 38)}, modelsValues)
	// Without the collector the longest name is -worker-metrics: 47 fit.
	noCollector := map[string]any{"logCollector": map[string]any{"enabled": false}}
	mustRender(t, map[string]any{"fullnameOverride": strings.Repeat("x", 47), "logCollector": noCollector["logCollector"]}, modelsValues)
	if _, err := render(t, map[string]any{"fullnameOverride": strings.Repeat("x", 48), "logCollector": noCollector["logCollector"]}, modelsValues); err == nil {
		t.Error("a 48-character full name without the collector rendered")
	}
}

// pprof has no auth: dispatcher.pprofPort serves it on the pod's loopback, which
// kubectl port-forward reaches (it connects inside the pod) and other pods do not.
func TestChartDispatcherPprofListensOnLoopbackOnly(t *testing.T) {
	r := mustRender(t, nil, allOnValues)
	c := container(t, one[*appsv1.Deployment](t, r, "sr-smartroute-dispatcher").Spec.Template.Spec, "dispatcher")
	if got := env(c)["PPROF_ADDR"].Value; got != "127.0.0.1:6060" {
		t.Errorf("PPROF_ADDR = %q, want 127.0.0.1:6060 (dispatcher.pprofPort on loopback)", got)
	}
	for _, p := range c.Ports {
		if p.ContainerPort == 6060 {
			t.Errorf("container port %+v declared for a loopback-only listener", p)
		}
	}
}

// KEDA's spec.cooldownPeriod only delays scaling to 0, and minReplicas is at least 1:
// workers.autoscaling.cooldownPeriod must reach the scale-down window of the HPA that
// KEDA makes (its advanced behavior), as it does the chart's own HPA.
func TestChartAutoscalerScaleDownWaitsTheCooldownPeriod(t *testing.T) {
	window := func(b *autoscalingv2.HorizontalPodAutoscalerBehavior) any {
		if b == nil || b.ScaleDown == nil || b.ScaleDown.StabilizationWindowSeconds == nil {
			return nil
		}
		return *b.ScaleDown.StabilizationWindowSeconds
	}
	for _, kind := range []string{"keda", "hpa"} {
		r := mustRender(t, map[string]any{"workers": map[string]any{"autoscaling": map[string]any{
			"type": kind, "cooldownPeriod": 900}}}, allOnValues)
		var got any
		if kind == "keda" {
			so := one[*scaledObject](t, r, "sr-smartroute-worker")
			if a := so.Spec.Advanced; a != nil && a.HorizontalPodAutoscalerConfig != nil {
				got = window(a.HorizontalPodAutoscalerConfig.Behavior)
			}
		} else {
			got = window(one[*autoscalingv2.HorizontalPodAutoscaler](t, r, "sr-smartroute-worker").Spec.Behavior)
		}
		if got != int32(900) {
			t.Errorf("%s: scale-down stabilization window %v, want 900 (workers.autoscaling.cooldownPeriod)", kind, got)
		}
	}
	// The HPA API refuses a window above an hour.
	_, err := render(t, map[string]any{"workers": map[string]any{"autoscaling": map[string]any{"cooldownPeriod": 3601}}}, allOnValues)
	if err == nil || !strings.Contains(err.Error(), "cooldownPeriod") {
		t.Errorf("cooldownPeriod 3601: %v, want an error naming it", err)
	}
}

// selects says whether a NetworkPolicy's pod selector picks pods labelled so.
func selects(sel metav1.LabelSelector, labels map[string]string) bool {
	s, err := metav1.LabelSelectorAsSelector(&sel)
	return err == nil && s.Matches(k8slabels.Set(labels))
}

// admission is what the NetworkPolicies rendered let into pods labelled so: the ports
// each peer list may reach (a nil list: from anywhere), and whether any policy selects
// them at all (unselected pods admit everything).
func admission(r *rendered, labels map[string]string) (isolated bool, from map[int32][][]networkingv1.NetworkPolicyPeer) {
	from = map[int32][][]networkingv1.NetworkPolicyPeer{}
	for _, np := range find[*networkingv1.NetworkPolicy](r) {
		if !selects(np.Spec.PodSelector, labels) || !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
			continue
		}
		isolated = true
		for _, rule := range np.Spec.Ingress {
			if len(rule.Ports) == 0 {
				from[0] = append(from[0], rule.From) // every port
			}
			for _, p := range rule.Ports {
				from[p.Port.IntVal] = append(from[p.Port.IntVal], rule.From)
			}
		}
	}
	return isolated, from
}

// Triton's HTTP and gRPC APIs take no credential and load and unload models; the agent
// calls them on 127.0.0.1. By default only the agent's metrics port is let into a worker
// pod, and only the workers (their log streams) into the collector, whose /logs takes no
// credential; the dispatcher, which checks credentials itself, is left alone.
func TestChartNetworkPolicyAdmitsOnlyMetricsIntoWorkers(t *testing.T) {
	r := mustRender(t, nil, modelsValues)
	pods := map[string]map[string]string{}
	for _, d := range find[*appsv1.Deployment](r) {
		pods[d.Name] = d.Spec.Template.Labels
	}
	for _, s := range find[*appsv1.StatefulSet](r) {
		pods[s.Name] = s.Spec.Template.Labels
	}
	isolated, from := admission(r, pods["sr-smartroute-worker"])
	if !isolated || len(from) != 1 || len(from[9091]) != 1 || from[9091][0] != nil {
		t.Errorf("into worker pods: isolated %v, admitted %v; want only port 9091 (the agent's metrics), from anywhere", isolated, from)
	}
	isolated, from = admission(r, pods["sr-smartroute-log-collector"])
	if !isolated || len(from) != 1 || len(from[8090]) != 1 || len(from[8090][0]) != 1 {
		t.Fatalf("into the collector: isolated %v, admitted %v; want port 8090 from the workers alone", isolated, from)
	}
	if p := from[8090][0][0]; p.PodSelector == nil || p.NamespaceSelector != nil || !selects(*p.PodSelector, pods["sr-smartroute-worker"]) ||
		selects(*p.PodSelector, pods["sr-smartroute-dispatcher"]) {
		t.Errorf("collector admits %+v, want the worker pods of this release", p)
	}
	if isolated, _ := admission(r, pods["sr-smartroute-dispatcher"]); isolated {
		t.Error("a NetworkPolicy selects the dispatcher, which producers and workers must reach")
	}

	// Who scrapes and who reads /logs, when given, are the only other peers.
	r = mustRender(t, nil, allOnValues)
	_, from = admission(r, pods["sr-smartroute-worker"])
	if len(from) != 1 || len(from[9091]) != 1 || len(from[9091][0]) != 1 || from[9091][0][0].NamespaceSelector == nil ||
		from[9091][0][0].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != "monitoring" {
		t.Errorf("into worker pods with metricsFrom: %v, want port 9091 from the monitoring namespace", from)
	}
	_, from = admission(r, pods["sr-smartroute-log-collector"])
	if len(from) != 1 || len(from[8090]) != 1 || len(from[8090][0]) != 4 {
		t.Errorf("into the collector with logReaders and metricsFrom: %v, want port 8090 from the workers, the two readers and the scraper", from)
	}

	if n := len(find[*networkingv1.NetworkPolicy](mustRender(t, map[string]any{"networkPolicy": map[string]any{"enabled": false}}, modelsValues))); n != 0 {
		t.Errorf("networkPolicy.enabled false: %d NetworkPolicies", n)
	}
}
