package agent

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// Backend text in a frame (Triton's errors run to 64 KiB) is cut to maxFrameText bytes at
// a character boundary, so that it fits any frame limit the dispatcher accepts and
// stays valid UTF-8.
func TestFrameTextIsBoundedAndValid(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("é", 40<<10) + "\xff"
	got := frameText(long)
	if len(got) > maxFrameText || len(got) < maxFrameText-1 || !utf8.ValidString(got) {
		t.Fatalf("frameText of %d bytes gave %d bytes (valid UTF-8 %v), want at most %d and valid", len(long), len(got), utf8.ValidString(got), maxFrameText)
	}
	if got := frameText("bad \xff byte"); got != "bad \uFFFD byte" {
		t.Fatalf("frameText kept an invalid byte: %q", got)
	}
}
