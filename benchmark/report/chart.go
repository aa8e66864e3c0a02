package report

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
)

// Chart colours of the two modes.
const (
	colorRouting = "#2b8cbe"
	colorRandom  = "#e34a33"
)

type chartPanel struct {
	title           string
	routing, random float64
	format          string
	ratio           Ratio
}

// WriteChart writes a self-contained SVG bar chart of the comparison: label misses,
// average task runtime and p95 latency, routing and random side by side, each panel
// on its own scale.
func WriteChart(w io.Writer, c Comparison) error {
	panels := []chartPanel{
		{"Label misses", float64(c.Routing.Worker.LabelMisses), float64(c.Random.Worker.LabelMisses), "%.0f", c.Misses()},
		{"Avg task runtime (s)", c.Routing.Worker.AvgTaskRuntime.Seconds(), c.Random.Worker.AvgTaskRuntime.Seconds(), "%.4f", c.Runtime()},
		{"p95 latency (s)", c.Routing.Producer.Latency.P95.Seconds(), c.Random.Producer.Latency.P95.Seconds(), "%.3f", c.P95()},
	}
	const (
		width, height = 780, 380
		panelW        = 250
		left          = 15
		plotTop       = 95
		plotBottom    = 300
		barW          = 70
	)
	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="#ffffff"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="%d" y="28" font-size="18" font-weight="bold" text-anchor="middle">smartroute: label routing vs random dispatch</text>`+"\n", width/2)
	fmt.Fprintf(&b, `<text x="%d" y="50" font-size="12" text-anchor="middle" fill="#555555">%s</text>`+"\n", width/2, esc(c.Routing.Settings.Describe()))
	// Legend.
	fmt.Fprintf(&b, `<rect x="%d" y="62" width="12" height="12" fill="%s"/><text x="%d" y="73" font-size="12">routing</text>`+"\n", width/2-90, colorRouting, width/2-73)
	fmt.Fprintf(&b, `<rect x="%d" y="62" width="12" height="12" fill="%s"/><text x="%d" y="73" font-size="12">random</text>`+"\n", width/2+20, colorRandom, width/2+37)

	for i, p := range panels {
		x0 := left + i*panelW
		top := max(p.routing, p.random)
		for j, v := range []float64{p.routing, p.random} {
			h := 0.0
			if top > 0 {
				h = v / top * (plotBottom - plotTop - 20)
			}
			x := x0 + 45 + j*(barW+20)
			color := colorRouting
			if j == 1 {
				color = colorRandom
			}
			fmt.Fprintf(&b, `<rect x="%d" y="%.1f" width="%d" height="%.1f" fill="%s"/>`+"\n", x, plotBottom-h, barW, h, color)
			fmt.Fprintf(&b, `<text x="%d" y="%.1f" font-size="12" text-anchor="middle">%s</text>`+"\n", x+barW/2, plotBottom-h-5, esc(fmt.Sprintf(p.format, v)))
		}
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333333"/>`+"\n", x0+30, plotBottom, x0+panelW-30, plotBottom)
		fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="14" text-anchor="middle">%s</text>`+"\n", x0+panelW/2, plotBottom+25, esc(p.title))
		fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="13" font-weight="bold" text-anchor="middle" fill="%s">%s</text>`+"\n", x0+panelW/2, plotBottom+48, colorRouting, esc(p.ratio.Text))
	}
	b.WriteString("</svg>\n")
	_, err := w.Write(b.Bytes())
	return err
}

func esc(s string) string {
	var b bytes.Buffer
	xml.EscapeText(&b, []byte(s))
	return b.String()
}
