package dispatcher

import (
	"bytes"
)

// scanRunTask decodes the form producers send nearly always — one flat object with
// the known keys spelled exactly, each at most once, strings of printable ASCII with
// the short escapes, an integer timeout_ms, parameters_json as a string — in one pass
// and with no reflection: encoding/json was a tenth of the dispatcher's CPU per task.
// For anything else (other spellings, \u escapes, non-ASCII, objects as parameters,
// nulls, any error) it reports false and decodeRunTask decides, so that both what is
// accepted and every error message stay encoding/json's. FuzzScanRunTask holds the
// two to the same fields for every body scanRunTask accepts.
func scanRunTask(body []byte) (runTaskFields, bool) {
	s := scanner{b: body}
	var f runTaskFields
	var seen uint8
	if !s.byte('{') {
		return f, false
	}
	if s.byte('}') {
		return f, s.end()
	}
	for {
		key, ok := s.rawString()
		if !ok || !s.byte(':') {
			return f, false
		}
		var bit uint8
		switch string(key) {
		case "task_id":
			bit = 1
			f.id, ok = s.str()
		case "task_type":
			bit = 2
			f.taskType, ok = s.str()
		case "label":
			bit = 4
			f.label, ok = s.str()
		case "parameters_json":
			bit = 8
			f.params, ok = s.params()
		case "return_result":
			bit = 16
			var v bool
			v, ok = s.boolean()
			f.returnResult = &v
		case "timeout_ms":
			bit = 32
			var v int64
			v, ok = s.integer()
			f.timeoutMS = &v
		default:
			return f, false
		}
		if !ok || seen&bit != 0 {
			return f, false
		}
		seen |= bit
		if s.byte(',') {
			continue
		}
		if s.byte('}') {
			return f, s.end()
		}
		return f, false
	}
}

// scanner walks a body; every method skips leading white space and reports false
// rather than guess.
type scanner struct {
	b []byte
	i int
}

func (s *scanner) space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// byte consumes c if it comes next.
func (s *scanner) byte(c byte) bool {
	s.space()
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// end reports whether only white space is left.
func (s *scanner) end() bool {
	s.space()
	return s.i == len(s.b)
}

// rawString returns a string without escapes, aliasing the body.
func (s *scanner) rawString() ([]byte, bool) {
	if !s.byte('"') {
		return nil, false
	}
	start := s.i
	if s.i = plainRun(s.b, start); s.i == len(s.b) || s.b[s.i] != '"' {
		return nil, false
	}
	s.i++
	return s.b[start : s.i-1], true
}

// stopByte marks the bytes that end a run of plain string bytes: the closing quote, a
// backslash, and anything that is not printable ASCII.
var stopByte = func() (t [256]bool) {
	for c := range len(t) {
		t[c] = c < 0x20 || c > 0x7e || c == '"' || c == '\\'
	}
	return t
}()

// plainRun returns the index of the first stop byte in b from i on, or len(b). One
// table load per byte in a local index: this loop reads every string of every
// /run-task body.
func plainRun(b []byte, i int) int {
	for i < len(b) && !stopByte[b[i]] {
		i++
	}
	return i
}

// unescaped returns a string's bytes with the short escapes resolved, in a new slice.
func (s *scanner) unescaped() ([]byte, bool) {
	if !s.byte('"') {
		return nil, false
	}
	start := s.i
	// Most strings have no escape: find the end first and copy once.
	s.i = plainRun(s.b, start)
	switch {
	case s.i == len(s.b):
		return nil, false
	case s.b[s.i] == '"':
		s.i++
		return bytes.Clone(s.b[start : s.i-1]), true
	case s.b[s.i] != '\\':
		return nil, false
	}
	out := make([]byte, s.i-start, len(s.b)-start)
	copy(out, s.b[start:s.i])
	for ; s.i < len(s.b); s.i++ {
		c := s.b[s.i]
		switch {
		case c == '"':
			s.i++
			return out, true
		case c < 0x20 || c > 0x7e:
			return nil, false
		case c != '\\':
			out = append(out, c)
			continue
		}
		if s.i++; s.i == len(s.b) {
			return nil, false
		}
		switch e := s.b[s.i]; e {
		case '"', '\\', '/':
			out = append(out, e)
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		default: // \u and invalid escapes: encoding/json decides
			return nil, false
		}
	}
	return nil, false
}

func (s *scanner) str() (string, bool) {
	b, ok := s.rawString()
	return string(b), ok
}

// params reads parameters_json given as a string holding a JSON document.
func (s *scanner) params() ([]byte, bool) {
	b, ok := s.unescaped()
	if !ok {
		return nil, false
	}
	if len(b) == 0 {
		return nil, true
	}
	return b, validJSON(b)
}

func (s *scanner) boolean() (bool, bool) {
	s.space()
	switch {
	case bytes.HasPrefix(s.b[s.i:], []byte("true")):
		s.i += 4
		return true, true
	case bytes.HasPrefix(s.b[s.i:], []byte("false")):
		s.i += 5
		return false, true
	}
	return false, false
}

// integer reads -?(0|[1-9][0-9]*) of at most 15 digits, which cannot overflow.
func (s *scanner) integer() (int64, bool) {
	s.space()
	neg := s.i < len(s.b) && s.b[s.i] == '-'
	if neg {
		s.i++
	}
	start := s.i
	var v int64
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		v = v*10 + int64(s.b[s.i]-'0')
		s.i++
	}
	n := s.i - start
	if n == 0 || n > 15 || (n > 1 && s.b[start] == '0') {
		return 0, false
	}
	// A fraction or exponent is encoding/json's to refuse with its own message.
	if s.i < len(s.b) && (s.b[s.i] == '.' || s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		return 0, false
	}
	if neg {
		v = -v
	}
	return v, true
}
