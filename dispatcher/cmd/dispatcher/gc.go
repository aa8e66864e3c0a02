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
// --gc-percent nor GOGC says otherwise. Under load a cycle costs about the same however
// much garbage came before it (with the retained answers switched off, the heap stays
// at Go's 4 MB floor and GC costs no less per task), so twice Go's default target
// halves the GC's CPU: 4.5 -> 2.5 us per task at full load (gctrace, RESULTS.md "Sixth
// round"). The price is a heap up to three times the live data instead of two (8.6 ->
// 12.6 KiB per idle worker), which the memory limit below keeps inside a container's.
const defaultGCPercent = 200

// gcSettings is how the garbage collector was set up, for the start-up log.
type gcSettings struct {
	percent  int    // the GC target in effect; -1 is off
	source   string // "flag", "GOGC" or "default"
	memLimit int64  // the runtime's soft memory limit; math.MaxInt64 is none
	// memLimitErr says why the container's limit could not be read: the dispatcher
	// runs on without a memory limit rather than refusing to start.
	memLimitErr error
}

// gcPercent decides the GC target: --gc-percent (or GC_PERCENT) when given, else GOGC
// when set (the runtime has applied it already, so apply is false), else the default.
func gcPercent(flagValue int, flagGiven bool, gogc string, gogcSet bool) (percent int, source string, apply bool, err error) {
	switch {
	case flagGiven:
		if flagValue < 1 && flagValue != -1 {
			return 0, "", false, fmt.Errorf("--gc-percent %d: want a percentage of at least 1, or -1 for off", flagValue)
		}
		return flagValue, "flag", true, nil
	case gogcSet:
		if gogc == "off" {
			return -1, "GOGC", false, nil
		}
		p, err := strconv.Atoi(gogc)
		if err != nil {
			// The runtime ignores a GOGC it cannot read and uses 100.
			return 100, "GOGC", false, nil
		}
		return p, "GOGC", false, nil
	}
	return defaultGCPercent, "default", true, nil
}

// setupGC applies the GC target and sets the runtime's soft memory limit (GOMEMLIMIT) to
// memRatio of the container's memory limit (cgroup v1 or v2), so that a larger GC target
// makes use of memory the container has without running into its OOM kill: near the
// limit the collector runs as often as it must. GOMEMLIMIT in the environment wins; a
// ratio of 0 or no container limit leaves the memory limit unset. Only a bad setting is
// an error.
func setupGC(flagValue int, flagGiven bool, memRatio float64) (gcSettings, error) {
	gogc, gogcSet := os.LookupEnv("GOGC")
	percent, source, apply, err := gcPercent(flagValue, flagGiven, gogc, gogcSet)
	if err != nil {
		return gcSettings{}, err
	}
	if math.IsNaN(memRatio) || memRatio < 0 || memRatio > 1 {
		return gcSettings{}, fmt.Errorf("--memory-limit-ratio %v: want a share of the container's memory limit in (0, 1], or 0 for none", memRatio)
	}
	if apply {
		debug.SetGCPercent(percent)
	}
	s := gcSettings{percent: percent, source: source, memLimit: debug.SetMemoryLimit(-1)}
	if memRatio == 0 {
		return s, nil
	}
	limit, err := memlimit.Set(memlimit.WithRatio(memRatio), memlimit.WithProvider(memlimit.FromCgroup))
	switch {
	case err == nil:
		s.memLimit = limit
	case !errors.Is(err, memlimit.ErrNoCgroup) && !errors.Is(err, memlimit.ErrCgroupsNotSupported):
		s.memLimitErr = err
	}
	return s, nil
}
