package main

import (
	"errors"
	"fmt"
	"math"
	"os"
	"runtime/debug"
	"strconv"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// defaultGCPercent is the dispatcher's garbage-collector target (as GOGC) when neither
// --gc-percent nor GOGC says otherwise and no memory limit is in effect. Under load a
// cycle costs about the same however much garbage came before it (with the retained
// answers switched off, the heap stays at Go's 4 MB floor and GC costs no less per
// task), so twice Go's default target halves the GC's CPU: 4.5 -> 2.5 us per task at
// full load (gctrace, RESULTS.md "Sixth round"). The price is a heap up to three times
// the live data instead of two.
const defaultGCPercent = 200

// limitedGCPercent is the default target when a memory limit is in effect (the
// container's, read below, or GOMEMLIMIT): the limit bounds the heap, so the collector
// can wait for nine times the live data where there is room. gctrace at full load: 2.26
// -> 0.61 us of GC per task from 200, about 4% less CPU per task in three of four sets
// of paired runs (RESULTS.md "Twenty-third round"). Near the limit the collector runs as often as it
// must, as at any target. Without a limit it stays at defaultGCPercent, as nine times
// the retained answers (up to --task-retention-bytes) is more than a host expects.
const limitedGCPercent = 800

// gcSettings is how the garbage collector was set up, for the start-up log.
type gcSettings struct {
	percent  int    // the GC target in effect; -1 is off
	source   string // "flag", "GOGC", "default" or "default under a memory limit"
	memLimit int64  // the runtime's soft memory limit; math.MaxInt64 is none
	// memLimitErr says why the container's limit could not be read: the dispatcher
	// runs on without a memory limit rather than refusing to start.
	memLimitErr error
	// containerLimit is the container's memory limit when GOMEMLIMIT is set above it
	// (0 otherwise): the soft limit then does not keep the heap inside the container.
	containerLimit int64
}

// memoryLimitProvider reads the container's memory limit; tests replace it.
var memoryLimitProvider = memlimit.FromCgroup

// checkGCSettings refuses a bad --gc-percent or --memory-limit-ratio before anything is
// set.
func checkGCSettings(flagValue int, flagGiven bool, memRatio float64) error {
	if flagGiven && flagValue < 1 && flagValue != -1 {
		return fmt.Errorf("--gc-percent %d: want a percentage of at least 1, or -1 for off", flagValue)
	}
	if math.IsNaN(memRatio) || memRatio < 0 || memRatio > 1 {
		return fmt.Errorf("--memory-limit-ratio %v: want a share of the container's memory limit in (0, 1], or 0 for none", memRatio)
	}
	return nil
}

// gcPercent decides the GC target: --gc-percent (or GC_PERCENT) when given, else GOGC
// when set (the runtime has applied it already, so apply is false), else the default,
// which depends on whether a memory limit is in effect.
func gcPercent(flagValue int, flagGiven bool, gogc string, gogcSet bool, limited bool) (percent int, source string, apply bool) {
	switch {
	case flagGiven:
		return flagValue, "flag", true
	case gogcSet:
		if gogc == "off" {
			return -1, "GOGC", false
		}
		p, err := strconv.Atoi(gogc)
		if err != nil {
			// The runtime ignores a GOGC it cannot read and uses 100.
			return 100, "GOGC", false
		}
		return p, "GOGC", false
	}
	if limited {
		return limitedGCPercent, "default under a memory limit", true
	}
	return defaultGCPercent, "default", true
}

// setupGC sets the runtime's soft memory limit (GOMEMLIMIT) to memRatio of the
// container's memory limit (cgroup v1 or v2), so that the GC target makes use of memory
// the container has without running into its OOM kill: near the limit the collector
// runs as often as it must. GOMEMLIMIT in the environment wins; a ratio of 0 or no
// container limit leaves the memory limit unset. Then it applies the GC target, whose
// default is higher when there is a limit. Only a bad setting is an error, and it
// changes nothing.
func setupGC(flagValue int, flagGiven bool, memRatio float64) (gcSettings, error) {
	if err := checkGCSettings(flagValue, flagGiven, memRatio); err != nil {
		return gcSettings{}, err
	}
	s := gcSettings{memLimit: debug.SetMemoryLimit(-1)}
	if memRatio != 0 {
		limit, err := memlimit.Set(memlimit.WithRatio(memRatio), memlimit.WithProvider(memoryLimitProvider))
		switch {
		case err == nil:
			s.memLimit = limit
		case !errors.Is(err, memlimit.ErrNoCgroup) && !errors.Is(err, memlimit.ErrCgroupsNotSupported):
			s.memLimitErr = err
		}
		// Set leaves a GOMEMLIMIT as it is; one above the container's limit would let the
		// higher default target grow the heap into the OOM kill.
		if _, set := os.LookupEnv("GOMEMLIMIT"); set && s.memLimit != math.MaxInt64 {
			if c, err := memoryLimitProvider(); err == nil && c < uint64(s.memLimit) {
				s.containerLimit = int64(c)
			}
		}
	}
	gogc, gogcSet := os.LookupEnv("GOGC")
	var apply bool
	s.percent, s.source, apply = gcPercent(flagValue, flagGiven, gogc, gogcSet, s.memLimit != math.MaxInt64)
	if apply {
		debug.SetGCPercent(s.percent)
	}
	return s, nil
}
