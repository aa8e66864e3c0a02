package certfile

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// pair writes a self-signed certificate for name, with serial, and its key, as PEM.
func pair(t *testing.T, name string, serial int64) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
		DNSNames: []string{name}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
}

// write puts a file in place with a modification time of its own, as a Secret
// volume's swap does (a test writes faster than some file systems' clock ticks).
func write(t *testing.T, path string, b []byte, mod time.Time) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, mod, mod); err != nil {
		t.Fatal(err)
	}
}

func serialOf(t *testing.T, c *tls.Certificate) int64 {
	t.Helper()
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return leaf.SerialNumber.Int64()
}

// fixture is a Reloader on a pair with serial 1, written an hour ago, on a clock the
// test moves.
type fixture struct {
	r                 *Reloader
	certFile, keyFile string
	base              time.Time // the files' modification time
	now               time.Time
}

func (f *fixture) advance(d time.Duration) { f.now = f.now.Add(d) }

func loaded(t *testing.T) *fixture {
	t.Helper()
	dir := t.TempDir()
	f := &fixture{certFile: filepath.Join(dir, "tls.crt"), keyFile: filepath.Join(dir, "tls.key"),
		base: time.Now().Add(-time.Hour)}
	c1, k1 := pair(t, "svc", 1)
	write(t, f.certFile, c1, f.base)
	write(t, f.keyFile, k1, f.base)
	r, err := Load(f.certFile, f.keyFile)
	if err != nil {
		t.Fatal(err)
	}
	f.now = r.checked // the clock starts where Load read it
	r.now = func() time.Time { return f.now }
	f.r = r
	return f
}

// A renewed pair is served once CheckEvery has passed, without a restart; a pair
// changed into one that does not match (the certificate swapped, its key not yet)
// keeps the previous one and is reported; the next change is taken.
func TestRenewedPairIsServed(t *testing.T) {
	f := loaded(t)
	r, certFile, keyFile, base := f.r, f.certFile, f.keyFile, f.base
	var reloads []error
	r.OnReload = func(err error) { reloads = append(reloads, err) }
	get := func() int64 {
		c, err := r.GetCertificate(nil)
		if err != nil {
			t.Fatal(err)
		}
		return serialOf(t, c)
	}

	c2, k2 := pair(t, "svc", 2)
	write(t, certFile, c2, base.Add(time.Minute))
	write(t, keyFile, k2, base.Add(time.Minute))
	if s := get(); s != 1 {
		t.Fatalf("before CheckEvery passed: serial %d, want 1", s)
	}
	f.advance(CheckEvery)
	if s := get(); s != 2 || len(reloads) != 1 || reloads[0] != nil {
		t.Fatalf("after the renewal: serial %d, reloads %v; want 2 and one good reload", s, reloads)
	}

	c3, k3 := pair(t, "svc", 3)
	write(t, certFile, c3, base.Add(2*time.Minute)) // its key not swapped in yet
	f.advance(CheckEvery)
	if s := get(); s != 2 || len(reloads) != 2 || reloads[1] == nil {
		t.Fatalf("with a mismatched pair: serial %d, reloads %v; want 2 kept and an error", s, reloads)
	}
	f.advance(CheckEvery)
	if get(); len(reloads) != 2 {
		t.Fatalf("the unchanged bad pair was read again: %v", reloads)
	}
	write(t, keyFile, k3, base.Add(2*time.Minute))
	f.advance(CheckEvery)
	if s := get(); s != 3 || len(reloads) != 3 || reloads[2] != nil {
		t.Fatalf("once the key arrived: serial %d, reloads %v", s, reloads)
	}
}

// A TLS server configured with GetCertificate hands the renewed certificate to a new
// client, over a real handshake.
func TestHandshakeGetsTheRenewedCertificate(t *testing.T) {
	f := loaded(t)
	r, certFile, keyFile, base := f.r, f.certFile, f.keyFile, f.base
	c2, k2 := pair(t, "svc", 2)
	write(t, certFile, c2, base.Add(time.Minute))
	write(t, keyFile, k2, base.Add(time.Minute))
	f.advance(CheckEvery)

	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{GetCertificate: r.GetCertificate, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			_ = c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	conn, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{InsecureSkipVerify: true, ServerName: "svc"}) // only the serial is checked
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if s := conn.ConnectionState().PeerCertificates[0].SerialNumber.Int64(); s != 2 {
		t.Fatalf("handshake served serial %d, want the renewed 2", s)
	}
}

// Load fails at once on a missing or broken pair: a start error.
func TestLoadRefusesABadPair(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if _, err := Load(certFile, keyFile); err == nil {
		t.Fatal("Load of missing files succeeded")
	}
	c1, _ := pair(t, "svc", 1)
	_, k2 := pair(t, "svc", 2)
	write(t, certFile, c1, time.Now())
	write(t, keyFile, k2, time.Now())
	if _, err := Load(certFile, keyFile); err == nil {
		t.Fatal("Load of a mismatched pair succeeded")
	}
}
