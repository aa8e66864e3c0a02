package triton

import "testing"

// An unload is over only when no version of the model holds memory: the index lists
// each version on its own row, in any order.
func TestHeldStateLooksAtEveryVersion(t *testing.T) {
	t.Parallel()
	row := func(name, version, state string) indexEntry {
		return indexEntry{Name: name, Version: version, State: state}
	}
	for _, c := range []struct {
		entries []indexEntry
		want    string
	}{
		{nil, ""},
		{[]indexEntry{{Name: "m"}}, ""},
		{[]indexEntry{row("m", "1", "UNAVAILABLE")}, ""},
		{[]indexEntry{row("m", "1", "UNLOADING"), row("m", "2", "UNAVAILABLE")}, "UNLOADING"},
		{[]indexEntry{row("m", "1", "UNAVAILABLE"), row("m", "2", "READY")}, "READY"},
		{[]indexEntry{row("m", "1", "READY"), row("m", "2", "UNLOADING"), row("m", "3", "UNAVAILABLE")}, "UNLOADING"},
		{[]indexEntry{row("other", "1", "UNLOADING"), row("m", "1", "UNAVAILABLE")}, ""},
	} {
		if got := heldState(c.entries, "m"); got != c.want {
			t.Errorf("heldState(%v) = %q, want %q", c.entries, got, c.want)
		}
	}
}
