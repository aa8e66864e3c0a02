package frame

import "unicode/utf8"

// MaxCloseReason is the longest close reason sent: a close frame's payload is at most
// 125 bytes, two of them the code.
const MaxCloseReason = 120

// CloseReason cuts reason to MaxCloseReason bytes at a character boundary. A reason cut
// inside a character is invalid UTF-8, which the peer must treat as a protocol error
// (RFC 6455 7.1.6): it would lose the code and the reason both.
func CloseReason(reason string) string { return CutText(reason, MaxCloseReason) }

// CutText cuts s to at most max bytes at a character boundary, so that valid UTF-8
// stays valid.
func CutText(s string, max int) string {
	if len(s) <= max {
		return s
	}
	n := max
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// MinMaxSize is the smallest frame limit either end accepts: a worker keeps 4 KiB of
// each result frame for the result's fields besides its body (error text included), so
// a smaller limit would leave no result room at all.
const MinMaxSize = 8 << 10
