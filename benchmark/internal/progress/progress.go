// Package progress draws a one-line progress bar for a run: requests done out of the
// total, the request rate and failures, redrawn in place with a carriage return.
package progress

import (
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"time"
)

// Bar is a running progress bar. A nil *Bar is valid and draws nothing, so callers
// need no checks when progress is off.
type Bar struct {
	w     io.Writer // written only by the draw goroutine until done is closed
	label string
	total int
	start time.Time

	// Counters: written by any goroutine through Add, read by the draw goroutine.
	done, failed atomic.Int64

	stop     chan struct{} // closed by Finish
	finished chan struct{} // closed by the draw goroutine when it has drawn its last line
}

// Start draws a bar for total requests on w every interval until Finish. It returns
// nil when w is nil.
func Start(w io.Writer, label string, total int, interval time.Duration) *Bar {
	if w == nil {
		return nil
	}
	b := &Bar{
		w:        w,
		label:    label,
		total:    total,
		start:    time.Now(),
		stop:     make(chan struct{}),
		finished: make(chan struct{}),
	}
	go b.draw(interval)
	return b
}

// Add counts one request done, failed when ok is false. Safe for concurrent use.
func (b *Bar) Add(ok bool) {
	if b == nil {
		return
	}
	b.done.Add(1)
	if !ok {
		b.failed.Add(1)
	}
}

// Finish draws the final state, ends the line, and returns once nothing more will be
// written. Call it once.
func (b *Bar) Finish() {
	if b == nil {
		return
	}
	close(b.stop)
	<-b.finished
}

func (b *Bar) draw(interval time.Duration) {
	defer close(b.finished)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			fmt.Fprint(b.w, "\r"+b.line()+"\n")
			return
		case <-t.C:
			fmt.Fprint(b.w, "\r"+b.line())
		}
	}
}

func (b *Bar) line() string {
	return Render(b.label, int(b.done.Load()), b.total, int(b.failed.Load()), time.Since(b.start))
}

// width is the number of cells of the bar itself.
const width = 30

// Render is one drawing of the bar, padded so a shorter line covers a longer one.
func Render(label string, done, total, failed int, elapsed time.Duration) string {
	frac := 0.0
	if total > 0 {
		frac = min(float64(done)/float64(total), 1)
	}
	cells := int(frac * width)
	var sb strings.Builder
	if label != "" {
		sb.WriteString(label + " ")
	}
	sb.WriteString("[" + strings.Repeat("=", cells))
	if cells < width {
		sb.WriteString(">" + strings.Repeat(" ", width-cells-1))
	}
	fmt.Fprintf(&sb, "] %d/%d %3.0f%%", done, total, frac*100)
	if secs := elapsed.Seconds(); secs > 0 {
		rate := float64(done) / secs
		fmt.Fprintf(&sb, " %.1f req/s", rate)
		if rate > 0 && done < total {
			eta := time.Duration(float64(total-done) / rate * float64(time.Second))
			fmt.Fprintf(&sb, " eta %s", eta.Round(time.Second))
		}
	}
	if failed > 0 {
		fmt.Fprintf(&sb, " %d failed", failed)
	}
	return fmt.Sprintf("%-90s", sb.String())
}
