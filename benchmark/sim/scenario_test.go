package sim

import (
	"path/filepath"
	"testing"
)

// The scenario files kept in the repository stay valid as the format changes.
func TestScenarioFilesLoad(t *testing.T) {
	paths, err := filepath.Glob("../scenarios/*.yaml")
	if err != nil || len(paths) == 0 {
		t.Fatalf("no scenario files (%v)", err)
	}
	for _, p := range paths {
		if _, err := Load(p); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
}
