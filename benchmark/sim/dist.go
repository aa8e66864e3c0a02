package sim

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"time"
)

// Dist is a distribution of durations.
type Dist struct {
	// Kind: "fixed" (value), "uniform" (min..max), "normal" (mean, stddev, floored at
	// min), or "exponential" (mean).
	Kind   string   `json:"kind"`
	Value  Duration `json:"value,omitempty"`
	Min    Duration `json:"min,omitempty"`
	Max    Duration `json:"max,omitempty"`
	Mean   Duration `json:"mean,omitempty"`
	Stddev Duration `json:"stddev,omitempty"`
}

// maxDistDuration bounds every duration a distribution names: a task's deadline is at
// most 24 h in the dispatcher (timeout_ms), and far larger ones overflowed the virtual
// clock (292 years of nanoseconds) once a few tasks were added up.
const maxDistDuration = 24 * time.Hour

func (d Dist) validate() error {
	for name, v := range map[string]Duration{"value": d.Value, "min": d.Min, "max": d.Max, "mean": d.Mean, "stddev": d.Stddev} {
		if v.D() > maxDistDuration {
			return fmt.Errorf("%s %v is over %v", name, v.D(), maxDistDuration)
		}
	}
	switch d.Kind {
	case "fixed":
		if d.Value < 0 {
			return errors.New("fixed value must not be negative")
		}
	case "uniform":
		if d.Min < 0 || d.Max < d.Min {
			return fmt.Errorf("uniform needs 0 <= min <= max, got %v..%v", d.Min.D(), d.Max.D())
		}
	case "normal":
		if d.Mean < 0 || d.Stddev < 0 || d.Min < 0 {
			return errors.New("normal mean, stddev and min must not be negative")
		}
	case "exponential":
		if d.Mean <= 0 {
			return errors.New("exponential mean must be positive")
		}
	default:
		return fmt.Errorf("kind %q unknown (fixed, uniform, normal, exponential)", d.Kind)
	}
	return nil
}

// sample draws one duration.
func (d Dist) sample(r *rand.Rand) time.Duration {
	switch d.Kind {
	case "fixed":
		return d.Value.D()
	case "uniform":
		return d.Min.D() + time.Duration(r.Float64()*float64(d.Max-d.Min))
	case "normal":
		v := time.Duration(r.NormFloat64()*float64(d.Stddev) + float64(d.Mean))
		return max(v, d.Min.D())
	case "exponential":
		return time.Duration(r.ExpFloat64() * float64(d.Mean))
	}
	return 0
}

// mean is the distribution's expected value (ignoring the normal's floor).
func (d Dist) mean() time.Duration {
	switch d.Kind {
	case "fixed":
		return d.Value.D()
	case "uniform":
		return (d.Min.D() + d.Max.D()) / 2
	case "normal", "exponential":
		return d.Mean.D()
	}
	return 0
}

// popularity draws label indexes.
type popularity struct {
	cdf []float64 // by rank; nil for uniform
	n   int
	// shifting: the ranking rotates by shiftBy every shiftEvery.
	shiftEvery time.Duration
	shiftBy    int
}

func newPopularity(l Labels) popularity {
	p := popularity{n: l.Count, shiftEvery: l.ShiftEvery.D(), shiftBy: l.ShiftBy}
	if l.Popularity == "zipf" || l.Popularity == "shifting" {
		// math/rand's Zipf needs an exponent above 1; the fleet scenario uses exactly 1.
		p.cdf = make([]float64, l.Count)
		sum := 0.0
		for k := range p.cdf {
			sum += 1 / math.Pow(float64(k+1), l.Exponent)
			p.cdf[k] = sum
		}
		for k := range p.cdf {
			p.cdf[k] /= sum
		}
	}
	return p
}

// draw returns a label index at virtual time now.
func (p popularity) draw(r *rand.Rand, now time.Duration) int {
	if p.cdf == nil {
		return r.IntN(p.n)
	}
	rank := sort.SearchFloat64s(p.cdf, r.Float64())
	if rank >= p.n {
		rank = p.n - 1
	}
	if p.shiftEvery > 0 {
		rank = (rank + int(now/p.shiftEvery)*p.shiftBy) % p.n
	}
	return rank
}
