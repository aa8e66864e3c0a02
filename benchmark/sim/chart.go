package sim

import (
	"fmt"
	"html"
	"io"
	"strings"
)

// WriteChart writes a self-contained SVG: one panel per metric (label misses, mean,
// p95 and p99 latency), one bar per policy, each panel scaled to its largest value.
func (rep Report) WriteChart(w io.Writer) error {
	type metric struct {
		name string
		val  func(Result) float64
		unit func(float64) string
	}
	metrics := []metric{
		{"label misses", func(r Result) float64 { return float64(r.Misses) }, func(v float64) string { return fmt.Sprintf("%.0f", v) }},
		{"mean latency", func(r Result) float64 { return r.MeanLatency }, secs},
		{"p95 latency", func(r Result) float64 { return r.P95Latency }, secs},
		{"p99 latency", func(r Result) float64 { return r.P99Latency }, secs},
	}
	colours := []string{"#9e9e9e", "#f4a261", "#2a9d8f", "#264653", "#e76f51", "#8ab17d"}
	const panelW, panelH, barGap, top = 220, 200, 8, 50
	width := panelW*len(metrics) + 20
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`, width, panelH+top+60)
	fmt.Fprintf(&b, `<text x="10" y="20" font-size="14">scenario %s, seed %d: lower is better</text>`, html.EscapeString(rep.Scenario.Name), rep.Seed)
	n := len(rep.Results)
	for mi, m := range metrics {
		x0 := 10 + mi*panelW
		maxV := 0.0
		for _, r := range rep.Results {
			maxV = max(maxV, m.val(r))
		}
		fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="12">%s</text>`, x0, top-10, m.name)
		barW := (panelW - 20 - barGap*(n-1)) / max(n, 1)
		for i, r := range rep.Results {
			v := m.val(r)
			h := 0
			if maxV > 0 {
				h = int(v / maxV * panelH)
			}
			x := x0 + i*(barW+barGap)
			fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" fill="%s"/>`, x, top+panelH-h, barW, h, colours[i%len(colours)])
			fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">%s</text>`, x+barW/2, top+panelH-h-3, m.unit(v))
			fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">%s</text>`, x+barW/2, top+panelH+14, html.EscapeString(r.Policy))
		}
	}
	b.WriteString(`</svg>`)
	_, err := io.WriteString(w, b.String()+"\n")
	return err
}
