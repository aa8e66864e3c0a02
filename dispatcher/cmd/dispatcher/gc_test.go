package main

import (
	"math"
	"os"
	"runtime/debug"
	"strings"
	"testing"
)

func TestGCPercentPrecedence(t *testing.T) {
	for _, tc := range []struct {
		name        string
		flagValue   int
		flagGiven   bool
		gogc        string
		gogcSet     bool
		wantPercent int
		wantSource  string
		wantApply   bool
		limited     bool
	}{
		{"default", defaultGCPercent, false, "", false, defaultGCPercent, "default", true, false},
		{"GOGC wins over the default", defaultGCPercent, false, "100", true, 100, "GOGC", false, false},
		{"GOGC off", defaultGCPercent, false, "off", true, -1, "GOGC", false, false},
		{"unreadable GOGC is the runtime's 100", defaultGCPercent, false, "lots", true, 100, "GOGC", false, false},
		{"the flag wins over GOGC", 400, true, "100", true, 400, "flag", true, false},
		{"the flag can turn it off", -1, true, "", false, -1, "flag", true, false},
		{"a higher default under a memory limit", defaultGCPercent, false, "", false, limitedGCPercent, "default under a memory limit", true, true},
		{"GOGC wins under a memory limit too", defaultGCPercent, false, "100", true, 100, "GOGC", false, true},
		{"the flag wins under a memory limit too", 300, true, "", false, 300, "flag", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, src, apply, err := gcPercent(tc.flagValue, tc.flagGiven, tc.gogc, tc.gogcSet, tc.limited)
			if err != nil {
				t.Fatal(err)
			}
			if p != tc.wantPercent || src != tc.wantSource || apply != tc.wantApply {
				t.Fatalf("gcPercent = %d, %q, apply %v; want %d, %q, apply %v", p, src, apply, tc.wantPercent, tc.wantSource, tc.wantApply)
			}
		})
	}
}

// restoreGC puts the runtime's GC settings back after a test that changes them.
func restoreGC(t *testing.T) {
	percent := debug.SetGCPercent(100)
	limit := debug.SetMemoryLimit(-1)
	t.Cleanup(func() {
		debug.SetGCPercent(percent)
		debug.SetMemoryLimit(limit)
	})
}

func TestSetupGCRejectsBadSettingsAndChangesNothing(t *testing.T) {
	restoreGC(t)
	before := debug.SetGCPercent(-1)
	debug.SetGCPercent(before)
	for _, tc := range []struct {
		percent int
		ratio   float64
		want    string
	}{
		{0, 0.9, "--gc-percent 0"},
		{-5, 0.9, "--gc-percent -5"},
		{300, 1.5, "--memory-limit-ratio 1.5"},
		{300, -0.1, "--memory-limit-ratio -0.1"},
		{300, math.NaN(), "--memory-limit-ratio NaN"},
	} {
		_, err := setupGC(tc.percent, true, tc.ratio)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("setupGC(%d, %v) error %v, want one naming %q", tc.percent, tc.ratio, err, tc.want)
		}
		if now := debug.SetGCPercent(before); now != before {
			t.Errorf("setupGC(%d, %v) failed but changed the GC target to %d", tc.percent, tc.ratio, now)
		}
	}
}

func TestSetupGCAppliesTheTargetAndNoLimitAtRatioZero(t *testing.T) {
	restoreGC(t)
	s, err := setupGC(300, true, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := debug.SetGCPercent(100); got != 300 || s.percent != 300 || s.source != "flag" {
		t.Errorf("GC target %d (reported %d from %q), want 300 from the flag", got, s.percent, s.source)
	}
	if s.memLimit != math.MaxInt64 || debug.SetMemoryLimit(-1) != math.MaxInt64 {
		t.Errorf("memory limit %d with ratio 0, want none", s.memLimit)
	}
}

// unsetenv removes an environment variable for the test, restoring it afterwards.
func unsetenv(t *testing.T, name string) {
	t.Setenv(name, "") // registers the restore
	os.Unsetenv(name)
}

func TestSetupGCDefaultFollowsTheMemoryLimit(t *testing.T) {
	restoreGC(t)
	unsetenv(t, "GOGC")
	// No limit: ratio 0 reads no container limit, and the runtime has none.
	debug.SetMemoryLimit(math.MaxInt64)
	s, err := setupGC(defaultGCPercent, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := debug.SetGCPercent(100); got != defaultGCPercent || s.percent != defaultGCPercent || s.source != "default" {
		t.Errorf("without a memory limit: GC target %d (reported %d from %q), want %d by default", got, s.percent, s.source, defaultGCPercent)
	}
	// GOMEMLIMIT as the runtime applied it at start: the container's is then not read.
	t.Setenv("GOMEMLIMIT", "512MiB")
	debug.SetMemoryLimit(512 << 20)
	s, err = setupGC(defaultGCPercent, false, 0.9)
	if err != nil {
		t.Fatal(err)
	}
	if got := debug.SetGCPercent(100); got != limitedGCPercent || s.percent != limitedGCPercent || s.source != "default under a memory limit" {
		t.Errorf("under GOMEMLIMIT: GC target %d (reported %d from %q), want %d by default", got, s.percent, s.source, limitedGCPercent)
	}
	if s.memLimit != 512<<20 {
		t.Errorf("memory limit reported %d, want GOMEMLIMIT's %d", s.memLimit, 512<<20)
	}
}
