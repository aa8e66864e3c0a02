package dispatcher

import (
	"bytes"
	"encoding/json"

	"github.com/tidwall/gjson"
)

// maxJSONNesting is encoding/json's nesting limit: deeper documents are invalid to it.
const maxJSONNesting = 10000

// validJSON reports what json.Valid reports, about three times faster: every result
// and every task's parameters pass through here, and encoding/json's scanner makes a
// call per byte. gjson's validator agrees with encoding/json (FuzzValidJSON) up to
// that nesting limit, which it does not have; it also recurses per level, so a
// document that could nest that deep, having as many brackets, goes to encoding/json.
func validJSON(b []byte) bool {
	if bytes.Count(b, []byte{'['})+bytes.Count(b, []byte{'{'}) >= maxJSONNesting {
		return json.Valid(b)
	}
	return gjson.ValidBytes(b)
}
