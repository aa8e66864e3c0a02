package main

import (
	"net"
	"os"
	"testing"
)

// A configuration the collector cannot start with exits 2, as the other commands do;
// a failure at run time (here the address already taken) exits 1.
func TestBadConfigurationExitsTwo(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for _, c := range []struct {
		args []string
		want int
	}{
		{[]string{"--no-such-flag"}, 2},
		{[]string{"--max-files", "0"}, 2},
		{[]string{"--max-active-batches", "0"}, 2}, // Config would read 0 as the default, 16
		{[]string{"--max-active-queries", "0"}, 2},
		{[]string{"--query-write-timeout", "0s"}, 2},
		{[]string{"--memory-limit-ratio", "1.5"}, 2},
		{[]string{"--memory-limit-ratio", "NaN"}, 2},
		{[]string{"--memory-limit-ratio", "-0.1"}, 2},
		// A token list that holds no token turned authentication off.
		{[]string{"--ingest-token", " , "}, 2},
		{[]string{"--ingest-token", " "}, 2},
		{[]string{"--ingest-token="}, 2}, // --ingest-token=$UNSET
		{[]string{"--log-level", "loud"}, 2},
		{[]string{"--log-level", ""}, 2}, // NoLevel: the log silently off
		{[]string{"stray"}, 2},
		{[]string{"--tls-cert", "/nonexistent.pem", "--tls-key", "/nonexistent.key"}, 2}, // New's config check
		{[]string{"--addr", busy.Addr().String()}, 1},
	} {
		args := append([]string{"--dir", t.TempDir()}, c.args...)
		if c.args[0] != "--addr" {
			args = append([]string{"--addr", "127.0.0.1:0"}, args...)
		}
		err := run(args)
		if err == nil {
			t.Fatalf("%q: started", c.args)
		}
		if got := exitCode(err); got != c.want {
			t.Errorf("%q: exit %d, want %d (%v)", c.args, got, c.want, err)
		}
	}
}

// INGEST_TOKEN set and holding no token (the chart fills it from a Secret's key, and
// an existingSecret may have that key empty) is refused as --ingest-token= is: read
// as no tokens, it opened /ingest to anyone. The address is taken so that a start
// that got past the check fails at once (exit 1) rather than serving.
func TestIngestTokenVariableWithNoTokenExitsTwo(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for _, c := range []struct {
		value string
		set   bool
		want  int
	}{
		{"", true, 2},
		{" , ", true, 2},
		{"", false, 1},    // unset: no credentials asked, as documented
		{"tok1", true, 1}, // tokens: started, then the address was taken
	} {
		if c.set {
			t.Setenv("INGEST_TOKEN", c.value)
		} else {
			t.Setenv("INGEST_TOKEN", "") // restored after the test
			os.Unsetenv("INGEST_TOKEN")
		}
		err := run([]string{"--addr", busy.Addr().String(), "--dir", t.TempDir()})
		if got := exitCode(err); err == nil || got != c.want {
			t.Errorf("INGEST_TOKEN=%q (set %v): exit %d (%v), want %d", c.value, c.set, got, err, c.want)
		}
	}
}
