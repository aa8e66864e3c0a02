package main

import (
	"errors"
	"math"
	"os"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

func TestGCPercentPrecedence(t *testing.T) {
	for _, tc := range []struct {
		name        string
		flagValue   int
		flagGiven   bool
		gogc        string
		gogcSet     bool
		limited     bool
		wantPercent int
		wantSource  string
		wantApply   bool
	}{
		{"default", 0, false, "", false, false, defaultGCPercent, "default", true},
		{"GOGC wins over the default", 0, false, "100", true, false, 100, "GOGC", false},
		{"GOGC off", 0, false, "off", true, false, -1, "GOGC", false},
		{"unreadable GOGC is the runtime's 100", 0, false, "lots", true, false, 100, "GOGC", false},
		{"the flag wins over GOGC", 400, true, "100", true, false, 400, "flag", true},
		{"the flag can turn it off", -1, true, "", false, false, -1, "flag", true},
		{"a higher default under a memory limit", 0, false, "", false, true, limitedGCPercent, "default under a memory limit", true},
		{"GOGC wins under a memory limit too", 0, false, "100", true, true, 100, "GOGC", false},
		{"the flag wins under a memory limit too", 300, true, "", false, true, 300, "flag", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, src, apply := gcPercent(tc.flagValue, tc.flagGiven, tc.gogc, tc.gogcSet, tc.limited)
			if p != tc.wantPercent || src != tc.wantSource || apply != tc.wantApply {
				t.Fatalf("gcPercent = %d, %q, apply %v; want %d, %q, apply %v", p, src, apply, tc.wantPercent, tc.wantSource, tc.wantApply)
			}
		})
	}
}

// hermeticGC gives a test the runtime's defaults (GC target 100, no memory limit) with
// none of the environment that setupGC reads, and a container memory limit of
// containerLimit (0: no cgroup at all), putting everything back afterwards. Without it
// a GOGC, GOMEMLIMIT or cgroup limit where the tests run would decide their outcome.
func hermeticGC(t *testing.T, containerLimit uint64) {
	percent := debug.SetGCPercent(100)
	limit := debug.SetMemoryLimit(math.MaxInt64)
	provider := memoryLimitProvider
	t.Cleanup(func() {
		debug.SetGCPercent(percent)
		debug.SetMemoryLimit(limit)
		memoryLimitProvider = provider
	})
	for _, name := range []string{"GOGC", "GOMEMLIMIT", "AUTOMEMLIMIT"} {
		t.Setenv(name, "") // registers the restore
		os.Unsetenv(name)
	}
	memoryLimitProvider = func() (uint64, error) {
		if containerLimit == 0 {
			return 0, memlimit.ErrNoCgroup
		}
		return containerLimit, nil
	}
}

func TestSetupGCRejectsBadSettingsAndChangesNothing(t *testing.T) {
	hermeticGC(t, 1<<30) // a limit that a wrongly accepted setting would set
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
		if now := debug.SetGCPercent(100); now != 100 {
			t.Errorf("setupGC(%d, %v) failed but changed the GC target to %d", tc.percent, tc.ratio, now)
		}
		if now := debug.SetMemoryLimit(-1); now != math.MaxInt64 {
			t.Errorf("setupGC(%d, %v) failed but set a memory limit of %d", tc.percent, tc.ratio, now)
		}
	}
}

func TestSetupGCAppliesTheTargetAndNoLimitAtRatioZero(t *testing.T) {
	hermeticGC(t, 1<<30)
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

func TestSetupGCDefaultFollowsTheMemoryLimit(t *testing.T) {
	for _, tc := range []struct {
		name           string
		containerLimit uint64 // 0: no cgroup
		providerErr    error  // the container's limit cannot be read
		gomemlimit     int64  // as the runtime applied GOMEMLIMIT at start; 0: unset
		ratio          float64
		wantPercent    int
		wantSource     string
		wantLimit      int64
		wantErr        bool
		wantAbove      int64 // the container's limit reported as below GOMEMLIMIT
	}{
		{name: "no container", ratio: 0.9, wantPercent: defaultGCPercent, wantSource: "default", wantLimit: math.MaxInt64},
		{name: "a container's limit", containerLimit: 1 << 30, ratio: 0.9,
			wantPercent: limitedGCPercent, wantSource: "default under a memory limit", wantLimit: 966367641}, // 90% of 1 GiB, rounded down,
		{name: "a container's limit, ratio 0", containerLimit: 1 << 30, ratio: 0,
			wantPercent: defaultGCPercent, wantSource: "default", wantLimit: math.MaxInt64},
		{name: "an unreadable limit", providerErr: errors.New("bad cgroup file"), ratio: 0.9,
			wantPercent: defaultGCPercent, wantSource: "default", wantLimit: math.MaxInt64, wantErr: true},
		{name: "GOMEMLIMIT wins over the container's", containerLimit: 1 << 30, gomemlimit: 512 << 20, ratio: 0.9,
			wantPercent: limitedGCPercent, wantSource: "default under a memory limit", wantLimit: 512 << 20},
		{name: "GOMEMLIMIT above the container's", containerLimit: 256 << 20, gomemlimit: 512 << 20, ratio: 0.9,
			wantPercent: limitedGCPercent, wantSource: "default under a memory limit", wantLimit: 512 << 20, wantAbove: 256 << 20},
		{name: "GOMEMLIMIT with ratio 0", gomemlimit: 512 << 20, ratio: 0,
			wantPercent: limitedGCPercent, wantSource: "default under a memory limit", wantLimit: 512 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hermeticGC(t, tc.containerLimit)
			if tc.providerErr != nil {
				memoryLimitProvider = func() (uint64, error) { return 0, tc.providerErr }
			}
			if tc.gomemlimit != 0 {
				t.Setenv("GOMEMLIMIT", "set")
				debug.SetMemoryLimit(tc.gomemlimit)
			}
			s, err := setupGC(0, false, tc.ratio)
			if err != nil {
				t.Fatal(err)
			}
			if got := debug.SetGCPercent(100); got != tc.wantPercent || s.percent != tc.wantPercent || s.source != tc.wantSource {
				t.Errorf("GC target %d (reported %d from %q), want %d from %q", got, s.percent, s.source, tc.wantPercent, tc.wantSource)
			}
			if got := debug.SetMemoryLimit(-1); got != tc.wantLimit || s.memLimit != tc.wantLimit {
				t.Errorf("memory limit %d (reported %d), want %d", got, s.memLimit, tc.wantLimit)
			}
			if s.containerLimit != tc.wantAbove {
				t.Errorf("container limit reported below GOMEMLIMIT: %d, want %d", s.containerLimit, tc.wantAbove)
			}
			if (s.memLimitErr != nil) != tc.wantErr {
				t.Errorf("memLimitErr %v, want an error: %v", s.memLimitErr, tc.wantErr)
			}
		})
	}
}
