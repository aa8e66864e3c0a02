package sim

import (
	"errors"
	"fmt"
	"math/rand/v2"
)

// Burst is how many tasks one arrival brings, all for one label and at one instant, as
// a batch job or a producer fanning a request out submits them. The zero value (no
// burst in the scenario) is one task per arrival and draws no random number, so a
// scenario without it runs as it did before bursts existed, seed for seed.
type Burst struct {
	// Kind: "fixed" (size tasks each) or "uniform" (min to max tasks, both included,
	// each as likely).
	Kind string `json:"kind"`
	Size int    `json:"size,omitempty"`
	Min  int    `json:"min,omitempty"`
	Max  int    `json:"max,omitempty"`
}

// maxBurst bounds a burst's size: a fan-out larger than this is better given as a
// trace, and the bound keeps max-min+1 from overflowing.
const maxBurst = 10_000

// on reports whether arrivals come in bursts at all.
func (b Burst) on() bool { return b != Burst{} }

// validate checks a burst given for arrivals of kind arrival; messages name the field.
func (b Burst) validate(arrival string) error {
	if !b.on() {
		return nil
	}
	if arrival == "trace" {
		return errors.New("arrival.burst does not apply to trace arrivals: each line is one task (lines of one time are a burst)")
	}
	inRange := func(v int) bool { return v >= 1 && v <= maxBurst }
	switch b.Kind {
	case "fixed":
		if b.Min != 0 || b.Max != 0 {
			return errors.New("arrival.burst.min and max are for uniform bursts; a fixed burst takes size")
		}
		if !inRange(b.Size) {
			return fmt.Errorf("arrival.burst.size must be from 1 to %d tasks, got %d", maxBurst, b.Size)
		}
	case "uniform":
		if b.Size != 0 {
			return errors.New("arrival.burst.size is for fixed bursts; a uniform burst takes min and max")
		}
		if !inRange(b.Min) || !inRange(b.Max) || b.Min > b.Max {
			return fmt.Errorf("arrival.burst needs 1 <= min <= max <= %d tasks for a uniform burst, got %d..%d", maxBurst, b.Min, b.Max)
		}
	case "":
		return errors.New("arrival.burst.kind is required when a burst is given (fixed, uniform)")
	default:
		return fmt.Errorf("arrival.burst.kind %q unknown (fixed, uniform)", b.Kind)
	}
	return nil
}

// size draws one arrival's number of tasks; only a uniform burst draws from r.
func (b Burst) size(r *rand.Rand) int {
	switch b.Kind {
	case "fixed":
		return b.Size
	case "uniform":
		return b.Min + r.IntN(b.Max-b.Min+1)
	}
	return 1
}

// mean is the expected number of tasks an arrival brings.
func (b Burst) mean() float64 {
	switch b.Kind {
	case "fixed":
		return float64(b.Size)
	case "uniform":
		return float64(b.Min+b.Max) / 2
	}
	return 1
}
