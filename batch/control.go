package batch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
)

// maxWorkTimeout bounds what the control server accepts.
const maxWorkTimeout = 24 * time.Hour

// workTimeoutBody is the seed's body: {"timeout": seconds}.
type workTimeoutBody struct {
	Timeout *float64 `json:"timeout"`
}

// maxWorkTimeoutBody bounds the /work-timeout body read.
const maxWorkTimeoutBody = 4 << 10

// parseWorkTimeout reads a /work-timeout body: one JSON object {"timeout": seconds},
// nothing after it, more than 0 and at most maxWorkTimeout. The seconds are bounded
// as a float, before they become a Duration: past int64 that conversion is
// platform-dependent (MinInt64 on amd64, MaxInt64 on arm64), so the range check
// after it refused 1e300 only by luck.
func parseWorkTimeout(r io.Reader) (time.Duration, error) {
	body, err := io.ReadAll(io.LimitReader(r, maxWorkTimeoutBody+1))
	if err != nil {
		return 0, fmt.Errorf("reading the body: %w", err)
	}
	if len(body) > maxWorkTimeoutBody {
		return 0, fmt.Errorf(`body must be {"timeout": seconds}, at most %d bytes`, maxWorkTimeoutBody)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	var b workTimeoutBody
	if err := dec.Decode(&b); err != nil {
		return 0, fmt.Errorf(`body must be {"timeout": seconds}: %w`, err)
	}
	if b.Timeout == nil {
		return 0, errors.New(`body must be {"timeout": seconds}: no timeout`)
	}
	// Anything after the object (a second object, a stray character) is refused: the
	// request is not what it seems, and only part of it would be applied.
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return 0, errors.New(`body must be {"timeout": seconds} and nothing after it`)
	}
	secs := *b.Timeout
	if !(secs > 0 && secs <= maxWorkTimeout.Seconds()) {
		return 0, fmt.Errorf("timeout must be between 0 and %d seconds, got %v", int(maxWorkTimeout.Seconds()), secs)
	}
	d := time.Duration(secs * float64(time.Second))
	if d <= 0 {
		return 0, fmt.Errorf("timeout must be between 0 and %d seconds, got %v, which is below a nanosecond", int(maxWorkTimeout.Seconds()), secs)
	}
	return d, nil
}

// Status is GET /status.
type Status struct {
	JobID            string  `json:"job_id"`
	NextLine         int64   `json:"next_line"`
	Lines            int64   `json:"lines"`
	Completed        int64   `json:"completed"`
	Rejected         int64   `json:"rejected"`
	LabelMisses      int64   `json:"label_misses"`
	Issued           int64   `json:"issued"`
	Reissued         int64   `json:"reissued"`
	InFlight         int64   `json:"in_flight"`
	Window           int64   `json:"window"`
	WindowBytes      int64   `json:"window_bytes"`
	WorkTimeoutSecs  float64 `json:"work_timeout"`
	ConcurrencyLimit int     `json:"concurrency"`
}

// startControl serves the control API on cfg.ControlAddr (or ControlListener) when set.
func (j *job) startControl() (stop func(), err error) {
	ln := j.cfg.ControlListener
	if ln == nil {
		if j.cfg.ControlAddr == "" {
			return func() {}, nil
		}
		if ln, err = net.Listen("tcp", j.cfg.ControlAddr); err != nil {
			return nil, fmt.Errorf("control server: %w", err)
		}
	}
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	setTimeout := func(c echo.Context) error {
		// Decoded as JSON whatever the Content-Type: curl -d, as README shows and the
		// seed's operators type, labels it a form, which Echo's Bind reads as one.
		d, err := parseWorkTimeout(c.Request().Body)
		if err != nil {
			return c.JSON(http.StatusBadRequest, map[string]string{"error": err.Error()})
		}
		j.timeout.Store(int64(d))
		select { // wake the loop: deadlines of items in flight move too
		case j.timeoutChanged <- struct{}{}:
		default:
		}
		j.log.Info().Dur("work_timeout", d).Msg("work timeout changed")
		return c.JSON(http.StatusOK, map[string]float64{"timeout": d.Seconds()})
	}
	e.POST("/work-timeout", setTimeout)
	e.POST("/work_timeout", setTimeout) // the seed's spelling
	e.GET("/status", func(c echo.Context) error { return c.JSON(http.StatusOK, j.status()) })
	srv := &http.Server{Handler: e, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			j.log.Error().Err(err).Msg("control server stopped")
		}
	}()
	j.log.Info().Str("addr", ln.Addr().String()).Msg("control server listening")
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}, nil
}

func (j *job) status() Status {
	return Status{
		JobID:            j.jobID,
		NextLine:         j.st.nextLine.Load(),
		Lines:            j.st.lines.Load(),
		Completed:        j.st.completed.Load(),
		Rejected:         j.st.rejected.Load(),
		LabelMisses:      j.st.misses.Load(),
		Issued:           j.st.issued.Load(),
		Reissued:         j.st.reissued.Load(),
		InFlight:         j.st.inFlight.Load(),
		Window:           j.st.window.Load(),
		WindowBytes:      j.st.windowBytes.Load(),
		WorkTimeoutSecs:  time.Duration(j.timeout.Load()).Seconds(),
		ConcurrencyLimit: j.cfg.Concurrency,
	}
}
