package kubernetes

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// prometheusRule holds the fields of monitoring.coreos.com/v1 PrometheusRule the chart
// writes (see serviceMonitor for why not the operator's own type).
type prometheusRule struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Alert       string            `json:"alert"`
				Expr        string            `json:"expr"`
				For         string            `json:"for,omitempty"`
				Labels      map[string]string `json:"labels"`
				Annotations map[string]string `json:"annotations"`
			} `json:"rules"`
		} `json:"groups"`
	} `json:"spec"`
}

// alertMetricLabels are the labels of each metric the alerts read, as the components
// define them (the README's metrics tables), beside the job and namespace Prometheus
// adds: a matcher or a "by" on a label the metric lacks selects nothing, and the alert
// never fires.
var alertMetricLabels = map[string][]string{
	"up": nil,
	"smartroute_dispatcher_connected_workers":          nil,
	"smartroute_dispatcher_tasks_failed_total":         {"label", "reason"},
	"smartroute_dispatcher_tasks_received_total":       {"label"},
	"smartroute_dispatcher_queue_wait_seconds":         {"le"},
	"smartroute_dispatcher_worker_disconnects_total":   {"code"},
	"smartroute_dispatcher_journal_write_errors_total": nil,
	"smartroute_agent_label_loads_total":               {"label", "result"},
	"smartroute_agent_triton_errors_total":             {"op"},
	"smartroute_agent_log_records_dropped_total":       nil,
	"smartroute_collector_write_errors_total":          nil,
}

// checkAlerts asserts every alert is one Prometheus loads: an expression that parses,
// over metrics a component exports, by labels they have, and this release's jobs
// only, a valid "for", a severity, and annotations whose Prometheus templates survived
// Helm's.
func checkAlerts(t *testing.T, pr *prometheusRule, collector bool) {
	t.Helper()
	if pr.Labels["release"] != "prometheus" {
		t.Errorf("PrometheusRule labels %v lack the values' release: prometheus", pr.Labels)
	}
	known := map[string]bool{"up": true}
	for _, m := range strings.Fields(exportedMetrics) {
		known[m] = true
	}
	alerts := map[string]bool{}
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			alerts[r.Alert] = true
			expr, err := parser.NewParser(parser.Options{}).ParseExpr(r.Expr)
			if err != nil {
				t.Errorf("%s: expr does not parse: %v\n%s", r.Alert, err, r.Expr)
				continue
			}
			parser.Inspect(expr, func(n parser.Node, path []parser.Node) error {
				vs, ok := n.(*parser.VectorSelector)
				if !ok {
					return nil
				}
				if !known[strings.TrimSuffix(vs.Name, "_bucket")] {
					t.Errorf("%s queries %s, which no component exports", r.Alert, vs.Name)
				}
				// Only this release's series: another release in the cluster must not fire it.
				var job, ns string
				labels, described := alertMetricLabels[strings.TrimSuffix(vs.Name, "_bucket")]
				if !described {
					t.Errorf("%s queries %s: add its labels to alertMetricLabels", r.Alert, vs.Name)
				}
				for _, m := range vs.LabelMatchers {
					switch m.Name {
					case "job":
						job = m.Value
					case "namespace":
						ns = m.Value
					case model.MetricNameLabel:
					default:
						if !slices.Contains(labels, m.Name) {
							t.Errorf("%s matches %s on label %q, which it does not have (%v)", r.Alert, vs.Name, m.Name, labels)
						}
					}
				}
				// Every "by" above this selector groups by labels it has.
				for _, anc := range path {
					if agg, ok := anc.(*parser.AggregateExpr); ok && !agg.Without {
						for _, g := range agg.Grouping {
							if !slices.Contains(labels, g) && g != "job" && g != "namespace" && g != "instance" {
								t.Errorf("%s sums %s by %q, a label it does not have (%v)", r.Alert, vs.Name, g, labels)
							}
						}
					}
				}
				if !strings.HasPrefix(job, "sr-smartroute-") || ns != "smartroute" {
					t.Errorf("%s selects %s with job %q namespace %q, want this release's", r.Alert, vs, job, ns)
				}
				return nil
			})
			if r.For != "" {
				if _, err := model.ParseDuration(r.For); err != nil {
					t.Errorf("%s: for %q: %v", r.Alert, r.For, err)
				}
			}
			if s := r.Labels["severity"]; s != "critical" && s != "warning" {
				t.Errorf("%s: severity %q", r.Alert, s)
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: annotations %v lack a summary or a description", r.Alert, r.Annotations)
			}
		}
	}
	for _, want := range []string{"SmartrouteDispatcherDown", "SmartrouteNoWorkersConnected", "SmartrouteTasksFailing",
		"SmartrouteQueueWaitHigh", "SmartrouteLabelLoadsFailing", "SmartrouteJournalWriteErrors"} {
		if !alerts[want] {
			t.Errorf("no alert %s in %v", want, alerts)
		}
	}
	if alerts["SmartrouteLogCollectorWriteErrors"] != collector {
		t.Errorf("log collector alerts present = %v, want %v (logCollector.enabled)", !collector, collector)
	}
}

// The values' thresholds reach the expressions, and Prometheus' own template markers in
// the annotations are left for Prometheus.
func TestAlertThresholdsAndTemplates(t *testing.T) {
	r := mustRender(t, map[string]any{"logCollector": map[string]any{"enabled": false},
		"metrics": map[string]any{"prometheusRule": map[string]any{"queueWaitP95Seconds": 12.5}}}, allOnValues)
	pr := one[*prometheusRule](t, r, "sr-smartroute")
	checkAlerts(t, pr, false)
	var exprs, notes strings.Builder
	for _, g := range pr.Spec.Groups {
		for _, rule := range g.Rules {
			exprs.WriteString(rule.Expr + "\n")
			notes.WriteString(rule.Annotations["description"] + "\n")
		}
	}
	for _, want := range []string{"> 0.02", "> 12.5"} {
		if !strings.Contains(exprs.String(), want) {
			t.Errorf("no expression holds %q:\n%s", want, exprs.String())
		}
	}
	if !strings.Contains(notes.String(), "{{ $value | humanizePercentage }}") || !strings.Contains(notes.String(), "{{ $labels.label }}") {
		t.Errorf("descriptions lost Prometheus' templates:\n%s", notes.String())
	}
}

// Alerts without the ServiceMonitor would select jobs that do not exist and never fire:
// the chart refuses that with a message, rather than installing silent alerts.
func TestAlertsNeedTheServiceMonitor(t *testing.T) {
	_, err := render(t, map[string]any{"metrics": map[string]any{
		"serviceMonitor": map[string]any{"enabled": false}, "prometheusRule": map[string]any{"enabled": true}}}, modelsValues)
	if err == nil || !strings.Contains(err.Error(), "needs metrics.serviceMonitor.enabled") {
		t.Fatalf("render error = %v, want one naming metrics.serviceMonitor.enabled", err)
	}
}

// Every alert the chart installs has its row in the README's alerts table, by its full
// name: an operator routes alerts from that table (SmartrouteJournalWriteErrors, a
// critical one, had been left out of it).
func TestEveryAlertIsInTheREADME(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(readme), "| alert | severity | fires when |")
	if !ok {
		t.Fatal("README has no alerts table")
	}
	table, _, _ = strings.Cut(table, "\n\n")
	r := mustRender(t, nil, allOnValues)
	pr := one[*prometheusRule](t, r, "sr-smartroute")
	n := 0
	for _, g := range pr.Spec.Groups {
		for _, rule := range g.Rules {
			n++
			row := ""
			for l := range strings.SplitSeq(table, "\n") {
				if strings.Contains(l, "`"+rule.Alert+"`") {
					row = l
				}
			}
			if row == "" {
				t.Errorf("alert %s is not in the README's alerts table", rule.Alert)
			} else if sev := rule.Labels["severity"]; !strings.Contains(row, "| "+sev+" |") {
				t.Errorf("alert %s is %s, but its README row says otherwise: %s", rule.Alert, sev, row)
			}
		}
	}
	if n < 10 {
		t.Fatalf("%d alerts rendered: the all-on values lost the collector's", n)
	}
}
