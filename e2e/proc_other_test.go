//go:build !linux

package e2e

import "os/exec"

// dieWithTest: only Linux has a parent-death signal. Elsewhere a child outlives a test
// binary that dies without running t.Cleanup (a -timeout panic).
func dieWithTest(cmd *exec.Cmd) *exec.Cmd { return cmd }

// claimBinDir and removeStaleBinDirs: without flock, binaries left by a test binary
// that died before TestMain removed them stay in the temp dir.
func claimBinDir(string) error { return nil }
func removeStaleBinDirs()      {}
