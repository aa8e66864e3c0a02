package live

import (
	"os"
	"strings"
	"testing"
)

func TestMemStat(t *testing.T) {
	profile := "heap profile: 1: 2 [3: 4] @ heap/1048576\n# runtime.MemStats\n# Alloc = 123\n# HeapInuse = 4194304\n# Stack = 1 / 2\n"
	if v, err := memStat(strings.NewReader(profile), "HeapInuse"); err != nil || v != 4<<20 {
		t.Fatalf("HeapInuse = %d, %v", v, err)
	}
	if _, err := memStat(strings.NewReader("# Alloc = 1\n"), "HeapInuse"); err == nil {
		t.Fatal("a profile without the field must be an error")
	}
	if _, err := memStat(strings.NewReader("# HeapInuse = lots\n"), "HeapInuse"); err == nil {
		t.Fatal("a non-numeric value must be an error")
	}
}

func TestResidentBytes(t *testing.T) {
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("no /proc")
	}
	rss, err := residentBytes(os.Getpid())
	if err != nil || rss < 1<<20 {
		t.Fatalf("RSS of this test = %d, %v", rss, err)
	}
}

func TestSoakFailures(t *testing.T) {
	ok := SoakResult{MaxGrowth: 0.1, HeapStart: 100, HeapEnd: 109, RSSStart: 100, RSSEnd: 95}
	if f := ok.Failures(); len(f) != 0 {
		t.Fatalf("flat run failed: %v", f)
	}
	bad := SoakResult{MaxGrowth: 0.1, Errors: 1, FirstError: "HTTP 503", HeapStart: 100, HeapEnd: 120, RSSStart: 100, RSSEnd: 100}
	if f := bad.Failures(); len(f) != 2 || !strings.Contains(f[0], "HTTP 503") || !strings.Contains(f[1], "heap") {
		t.Fatalf("failures %v", f)
	}
}
