//go:build !linux

package batch

import "os/exec"

// dieWithTest: only Linux has a parent-death signal. Elsewhere a child outlives a test
// binary that dies without running t.Cleanup (a -timeout panic).
func dieWithTest(cmd *exec.Cmd) *exec.Cmd { return cmd }
