package dispatcher

import (
	"bytes"
	"fmt"
	"os"
	"strings"

	"github.com/smartroute/smartroute/proto/credential"
	"github.com/smartroute/smartroute/proto/frame"
)

// workerTokens is the accepted worker tokens and, for each the tokens file binds to
// worker ids, the ids it may serve. Without a binding any holder of any token could
// connect under another worker's id, and the dispatcher replaces a live connection
// with a newer one of its id: its agent gives up on REPLACED, so one leaked token
// (or one compromised pool) could take any worker out of the fleet for good.
type workerTokens struct {
	set credential.Set
	// bound maps a bound token's hash to the ids it may serve: exact, or a prefix when
	// they end in "*". A token not in it serves any id.
	bound map[credential.Hash][]string
}

// serves says whether a token of the set may connect as worker id. Called only for a
// token set.Holds has accepted: the map lookup is not constant time.
func (w workerTokens) serves(h credential.Hash, id string) bool {
	ids, ok := w.bound[h]
	if !ok {
		return true
	}
	for _, p := range ids {
		if prefix, ok := strings.CutSuffix(p, "*"); ok && strings.HasPrefix(id, prefix) || p == id {
			return true
		}
	}
	return false
}

// workerIDField introduces a binding after a token on a tokens-file line.
const workerIDField = "worker-id="

// tokenLine is one line of a worker tokens file.
type tokenLine struct {
	n      int // line number, for errors
	secret string
	ids    []string
}

// parseWorkerTokens reads a worker tokens file: credential.Parse's format (one token a
// line, surrounding spaces trimmed, blank lines and # comments ignored), where a token
// may be followed, after spaces, by worker-id=<id> fields naming the only worker ids
// it may serve; an id ending in "*" serves every id with that prefix. A field starting
// with # ends the line. Anything else after a token is an error, as a space in a token
// always was, so every file valid before means what it meant. Errors name the line,
// never its content.
func parseWorkerTokens(data []byte) ([]tokenLine, error) {
	var out []tokenLine
	for n, line := range bytes.Split(data, []byte("\n")) {
		fields := strings.Fields(string(line))
		if len(fields) == 0 || fields[0][0] == '#' {
			continue
		}
		if err := credential.Check(fields[0]); err != nil {
			return nil, fmt.Errorf("line %d: %w", n+1, err)
		}
		tl := tokenLine{n: n + 1, secret: fields[0]}
		for _, f := range fields[1:] {
			if f[0] == '#' {
				break // a comment after the token
			}
			id, ok := strings.CutPrefix(f, workerIDField)
			if !ok {
				return nil, fmt.Errorf("line %d: after the token, only %s<worker id> fields may follow (a token holds no spaces)", n+1, workerIDField)
			}
			if err := frame.CheckWorkerIDField("worker-id", strings.TrimSuffix(id, "*")); err != nil && id != "*" {
				return nil, fmt.Errorf("line %d: %w", n+1, err)
			}
			tl.ids = append(tl.ids, id)
		}
		out = append(out, tl)
	}
	return out, nil
}

// loadWorkerTokens builds the worker tokens from those given directly (which serve any
// id) and, when file is not empty, the tokens file. A token both bound and unbound
// (twice in the file, or also in list) is refused: the binding would do nothing. Lines
// that bind one token add up.
func loadWorkerTokens(list []string, file string) (workerTokens, error) {
	set, err := credential.Load("WorkerTokens", list, "", "")
	if err != nil {
		return workerTokens{}, err
	}
	w := workerTokens{set: set}
	if file == "" {
		return w, nil
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return workerTokens{}, fmt.Errorf("WorkerTokensFile: %w", err)
	}
	lines, err := parseWorkerTokens(data)
	if err != nil {
		return workerTokens{}, fmt.Errorf("WorkerTokensFile %s: %w", file, err)
	}
	unbound := make(map[credential.Hash]string) // where each unbound token is, for errors
	for _, h := range set {
		unbound[h] = "in WorkerTokens"
	}
	boundAt := make(map[credential.Hash]int)
	for _, l := range lines {
		h := credential.Sum(l.secret)
		if len(l.ids) == 0 {
			if at, ok := boundAt[h]; ok {
				return workerTokens{}, fmt.Errorf("WorkerTokensFile %s: line %d: its token is bound to worker ids on line %d; a token serves any worker id or only those it names, not both", file, l.n, at)
			}
			unbound[h] = fmt.Sprintf("on line %d", l.n)
			w.set = append(w.set, h)
			continue
		}
		if at, ok := unbound[h]; ok {
			return workerTokens{}, fmt.Errorf("WorkerTokensFile %s: line %d: its token is also %s without %s fields; a token serves any worker id or only those it names, not both", file, l.n, at, workerIDField)
		}
		if w.bound == nil {
			w.bound = make(map[credential.Hash][]string)
		}
		if _, ok := boundAt[h]; !ok {
			boundAt[h] = l.n
			w.set = append(w.set, h)
		}
		w.bound[h] = append(w.bound[h], l.ids...)
	}
	return w, nil
}
