package credential

import (
	"strings"
	"testing"
)

func TestBearerToken(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"Bearer abc": "abc", "bearer abc": "abc", "BEARER  abc": "abc",
		"Bearer": "", "Bearer ": "", "Basic abc": "", "Bearer a b": "", "Bearerabc": "", "": "",
	} {
		got, ok := BearerToken(in)
		if got != want || ok != (want != "") {
			t.Errorf("BearerToken(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
}

func TestParse(t *testing.T) {
	t.Parallel()
	got, err := Parse([]byte("# comment\n\n tok-1 \r\ntok-2\n#tok-3\n"))
	if err != nil || len(got) != 2 || got[0] != "tok-1" || got[1] != "tok-2" {
		t.Fatalf("parseSecrets = %q, %v", got, err)
	}
	if _, err := Parse([]byte("ok\nnot\x00ok\n")); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("control byte: %v", err)
	}
}

// FuzzBearerToken: no header value panics the parser, and an accepted token is what
// checkSecret would accept as a configured secret (non-empty, no spaces).
func FuzzBearerToken(f *testing.F) {
	for _, s := range []string{"Bearer abc", "bearer   x", "Bearer", "Basic Zm9v", "Bearer a\tb", "bEaReR \x00", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, header string) {
		tok, ok := BearerToken(header)
		if !ok {
			if tok != "" {
				t.Fatalf("refused header %q returned token %q", header, tok)
			}
			return
		}
		if tok == "" || strings.ContainsAny(tok, " \t") || !strings.HasSuffix(header, tok) {
			t.Fatalf("header %q gave token %q", header, tok)
		}
	})
}

// FuzzParse: no file content panics the parser; every secret it returns is
// trimmed, non-empty, not a comment and valid for an Authorization header.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"tok\n", "# c\n a \r\n\nb", "a b\n", "\x00", "#only\n#comments", strings.Repeat("x", MaxBytes+1)} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		secrets, err := Parse(data)
		if err != nil {
			if secrets != nil {
				t.Fatalf("error %v with secrets", err)
			}
			return
		}
		for _, s := range secrets {
			if Check(s) != nil || s[0] == '#' {
				t.Fatalf("accepted secret %q", s)
			}
			if got, ok := BearerToken("Bearer " + s); !ok || got != s {
				t.Fatalf("secret %q does not round-trip through a bearer header: %q %v", s, got, ok)
			}
		}
	})
}

func TestSetHolds(t *testing.T) {
	t.Parallel()
	set := Set{Sum("a"), Sum("b")}
	if !set.Holds(Sum("b")) || set.Holds(Sum("c")) || (Set{}).Holds(Sum("")) {
		t.Fatal("Holds answered wrong")
	}
}
