package live

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// Scenarios are the seed's two published runs (2 workers × 2 labels, 2 producers,
// 2400 synchronous requests), as named presets. Each runs at a time scale that makes
// one mode take about a minute with the same shape; flags given with the preset win.
var Scenarios = map[string]func(*Config){
	// 4 labels, the fleet's full capacity, short pauses: the seed published
	// random 1193 misses / 0.2483 s against routing 138 / 0.0639 s.
	"seed-4": func(c *Config) { seedRun(c, 4, 750*time.Millisecond, 0.05) },
	// 5 labels, one more than the fleet holds, long pauses: the seed published
	// random 1448 / 0.3231 s against routing 563 / 0.1791 s.
	"seed-5": func(c *Config) { seedRun(c, 5, 2500*time.Millisecond, 0.02) },
}

func seedRun(c *Config, labels int, waitAvg time.Duration, scale float64) {
	c.NumWorkers, c.MaxLabels, c.Slots = 2, 2, 1
	c.Requests, c.Producers, c.SyncShare = 2400, 2, 1
	c.Labels = labels
	c.WaitAvg, c.WaitStddev = waitAvg, time.Second
	c.SimLoadTime, c.SimRunTime = 400*time.Millisecond, 50*time.Millisecond
	c.TimeScale = scale
}

// ApplyScenario sets the preset's values on c.
func ApplyScenario(c *Config, name string) error {
	apply, ok := Scenarios[name]
	if !ok {
		names := make([]string, 0, len(Scenarios))
		for n := range Scenarios {
			names = append(names, n)
		}
		sort.Strings(names)
		return fmt.Errorf("--scenario %q unknown (want one of %s)", name, strings.Join(names, ", "))
	}
	apply(c)
	return nil
}
