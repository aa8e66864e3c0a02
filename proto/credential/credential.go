// Package credential is the shared shape of smartroute's bearer credentials: how they
// travel (Authorization: Bearer), how they are written in token files, and how a
// service holds and checks them (sha256 hashes compared in constant time). The
// dispatcher and the log collector use it; the worker agent sends Header(token).
package credential

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"os"
	"strings"
)

// MaxBytes bounds a token or key: longer is a mistake (a pasted file), and it keeps
// the Authorization header small.
const MaxBytes = 4096

// Hash is the sha256 of a secret: services keep hashes, not the secrets.
type Hash [sha256.Size]byte

// Sum hashes a secret.
func Sum(secret string) Hash { return sha256.Sum256([]byte(secret)) }

// Set is the accepted secrets of one kind.
type Set []Hash

// Holds reports whether h is in the set, comparing every entry in constant time so
// that the time taken says nothing about which entry, or how much of one, matched.
func (s Set) Holds(h Hash) bool {
	found := 0
	for i := range s {
		found |= subtle.ConstantTimeCompare(s[i][:], h[:])
	}
	return found == 1
}

// Header is the Authorization header value that carries token.
func Header(token string) string { return "Bearer " + token }

// BearerToken extracts the token of an "Authorization: Bearer <token>" header value.
// The scheme is case-insensitive (RFC 9110); the token must be non-empty and hold no
// spaces or tabs.
func BearerToken(header string) (string, bool) {
	const scheme = "bearer "
	if len(header) <= len(scheme) || !strings.EqualFold(header[:len(scheme)], scheme) {
		return "", false
	}
	tok := strings.TrimLeft(header[len(scheme):], " ")
	if tok == "" || strings.ContainsAny(tok, " \t") {
		return "", false
	}
	return tok, true
}

// Check accepts what can travel in an Authorization header: visible ASCII, bounded.
// Its errors never quote the secret.
func Check(s string) error {
	if s == "" {
		return errors.New("empty secret")
	}
	if len(s) > MaxBytes {
		return fmt.Errorf("secret is %d bytes long, the limit is %d", len(s), MaxBytes)
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c > '~' {
			return fmt.Errorf("secret holds byte 0x%02x at %d; only visible ASCII without spaces is allowed", c, i)
		}
	}
	return nil
}

// Parse reads a tokens or keys file: one secret per line, surrounding spaces trimmed,
// blank lines and lines starting with # ignored. Errors name the line, never its
// content.
func Parse(data []byte) ([]string, error) {
	var out []string
	for n, line := range bytes.Split(data, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		if err := Check(string(line)); err != nil {
			return nil, fmt.Errorf("line %d: %w", n+1, err)
		}
		out = append(out, string(line))
	}
	return out, nil
}

// Load builds a Set from secrets given directly (listField names them in errors) and,
// when file is not empty, the secrets in that file (fileField names it).
func Load(listField string, list []string, fileField, file string) (Set, error) {
	var set Set
	for i, s := range list {
		if err := Check(s); err != nil {
			return nil, fmt.Errorf("%s[%d]: %w", listField, i, err)
		}
		set = append(set, Sum(s))
	}
	if file == "" {
		return set, nil
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", fileField, err)
	}
	secrets, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", fileField, file, err)
	}
	for _, s := range secrets {
		set = append(set, Sum(s))
	}
	return set, nil
}
