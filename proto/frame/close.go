package frame

import "unicode/utf8"

// MaxCloseReason is the longest close reason sent: a close frame's payload is at most
// 125 bytes, two of them the code.
const MaxCloseReason = 120

// CloseReason cuts reason to MaxCloseReason bytes at a character boundary. A reason cut
// inside a character is invalid UTF-8, which the peer must treat as a protocol error
// (RFC 6455 7.1.6): it would lose the code and the reason both.
func CloseReason(reason string) string {
	if len(reason) <= MaxCloseReason {
		return reason
	}
	n := MaxCloseReason
	for n > 0 && !utf8.RuneStart(reason[n]) {
		n--
	}
	return reason[:n]
}
