package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// post sends a task with headers and returns the status and the decoded answer.
func post(t *testing.T, client *http.Client, url, body string, header ...string) (int, taskAnswer) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var a taskAnswer
	if err := json.Unmarshal(raw, &a); err != nil {
		t.Fatalf("answer is not JSON: %q", raw)
	}
	return resp.StatusCode, a
}

func running(p *proc) bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// A dispatcher with a token file serves an agent with a listed token and refuses one
// with a wrong token, which keeps backing off without exiting. Removing a token from
// the file and sending SIGHUP disconnects the agent that used it; adding one lets the
// refused agent in.
func TestWorkerTokensFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tokens := filepath.Join(dir, "worker-tokens")
	if err := os.WriteFile(tokens, []byte("# the fleet\ngood-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := &stack{t: t, agents: map[string]*proc{}}
	s.startDispatcher(stackOpts{dispatcherArgs: []string{"--worker-tokens-file", tokens, "--api-key", "producer-key"}})
	agentArgs := func(id, token string) []string {
		return []string{"--dispatcher-url", "ws://" + s.addr + "/worker-listen", "--worker-id", id, "--worker-token", token,
			"--sim-load-time", "10ms", "--sim-run-time", "1ms"}
	}
	good := start(t, "worker-agent#good", agentArgs("good", "good-token")...)
	bad := start(t, "worker-agent#bad", agentArgs("bad", "wrong-token")...)
	s.waitWorkers(1)

	url := "http://" + s.addr + "/run-task"
	if code, a := post(t, http.DefaultClient, url, task("tok-1", "model-a", "")); code != 401 || !strings.Contains(a.Error, "API key") {
		t.Fatalf("task without an API key: %d %+v", code, a)
	}
	if code, a := post(t, http.DefaultClient, url, task("tok-1", "model-a", ""), "Authorization", "Bearer good-token"); code != 403 {
		t.Fatalf("task with a worker token: %d %+v", code, a)
	}
	code, a := post(t, http.DefaultClient, url, task("tok-1", "model-a", ""), "X-API-Key", "producer-key")
	if code != 200 || a.WorkerID != "good" {
		t.Fatalf("task with the key: %d %+v", code, a)
	}

	refused := `the dispatcher refused this worker's token`
	s.eventually("the bad agent refused three times", func() bool { return grepLog(t, bad, refused, `"level":"error"`, "401") >= 3 })
	if !running(bad) {
		t.Fatal("the agent with a wrong token exited; it must keep backing off")
	}
	if ids := s.workers(); len(ids) != 1 || ids[0] != "good" {
		t.Fatalf("workers %v", ids)
	}
	if n := grepLog(t, s.disp, "wrong-token") + grepLog(t, s.disp, "good-token") + grepLog(t, s.disp, "producer-key"); n != 0 {
		t.Fatalf("the dispatcher logged a secret on %d lines", n)
	}

	// Revoke good-token, admit wrong-token.
	if err := os.WriteFile(tokens, []byte("wrong-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s.disp.signal(t, syscall.SIGHUP)
	s.eventually("the good agent closed with UNAUTHORIZED", func() bool { return grepLog(t, good, refused, "CLOSE_CODE_UNAUTHORIZED") >= 1 })
	s.eventually("only the formerly refused agent connected", func() bool {
		ids := s.workers()
		return len(ids) == 1 && ids[0] == "bad"
	})
	if !running(good) {
		t.Fatal("the revoked agent exited; it must keep backing off")
	}
	if code, a := post(t, http.DefaultClient, url, task("tok-2", "model-a", ""), "X-API-Key", "producer-key"); code != 200 || a.WorkerID != "bad" {
		t.Fatalf("task after the reload: %d %+v", code, a)
	}
}

// Without credentials the dispatcher refuses to listen beyond loopback, and says which
// flag would allow it.
func TestDevModeRefusesNonLoopbackBind(t *testing.T) {
	t.Parallel()
	p := start(t, "dispatcher#exposed", "--addr", "0.0.0.0:0", "--data-dir", t.TempDir())
	err := p.wait(t, 20*time.Second)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() == 0 {
		t.Fatalf("dispatcher on 0.0.0.0 without credentials: exit %v, want non-zero", err)
	}
	if grepLog(t, p, "--insecure-no-auth", "0.0.0.0:0") != 1 {
		b, _ := os.ReadFile(p.log)
		t.Fatalf("the refusal does not name --insecure-no-auth:\n%s", b)
	}
}

// testPKI is a CA and a certificate it signed for 127.0.0.1, as PEM files.
type testPKI struct{ caFile, certFile, keyFile string }

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	dir := t.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "smartroute test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	p := testPKI{filepath.Join(dir, "ca.pem"), filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")}
	for file, block := range map[string]*pem.Block{
		p.caFile: {Type: "CERTIFICATE", Bytes: caDER}, p.certFile: {Type: "CERTIFICATE", Bytes: leafDER},
		p.keyFile: {Type: "EC PRIVATE KEY", Bytes: keyDER},
	} {
		if err := os.WriteFile(file, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// client trusts only the test CA.
func (p testPKI) client(t *testing.T) *http.Client {
	t.Helper()
	b, err := os.ReadFile(p.caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(b)
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
}

// The dispatcher and the collector serve TLS with a certificate from a private CA; the
// agent dials wss:// to both, trusting that CA with --ca-file, and authenticates to
// both with its worker token. An agent without the CA cannot connect.
func TestTLSDispatcherAndCollector(t *testing.T) {
	t.Parallel()
	pki := newTestPKI(t)
	client := pki.client(t)
	s := &stack{t: t, agents: map[string]*proc{}}
	waitHealthy := func(what, url string) {
		s.eventually(what, func() bool {
			resp, err := client.Get(url)
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == 200
		})
	}
	tlsArgs := []string{"--tls-cert", pki.certFile, "--tls-key", pki.keyFile}
	logDir := t.TempDir()
	coll := start(t, "log-collector#tls", append([]string{"--addr", "127.0.0.1:0", "--dir", logDir, "--ingest-token", "tls-token"}, tlsArgs...)...)
	collectorAddr := loggedAddr(t, coll, jsonAddr("log collector listening"))
	waitHealthy("collector healthy over https", "https://"+collectorAddr+"/health")
	s.disp = start(t, "dispatcher#tls", append([]string{"--addr", "127.0.0.1:0", "--data-dir", t.TempDir(), "--worker-token", "tls-token", "--api-key", "k", "--ops-auth"}, tlsArgs...)...)
	s.addr = loggedAddr(t, s.disp, jsonAddr("dispatcher listening"))
	waitHealthy("dispatcher healthy over https", "https://"+s.addr+"/health")

	agentArgs := []string{"--dispatcher-url", "wss://" + s.addr + "/worker-listen", "--worker-token", "tls-token",
		"--log-collector-url", "https://" + collectorAddr, "--sim-load-time", "10ms", "--sim-run-time", "1ms"}
	start(t, "worker-agent#tls", append([]string{"--worker-id", "tls-agent", "--ca-file", pki.caFile}, agentArgs...)...)
	untrusting := start(t, "worker-agent#no-ca", append([]string{"--worker-id", "no-ca"}, agentArgs...)...)

	// /workers needs the key (--ops-auth).
	workers := func(key string) (int, []string) {
		req, _ := http.NewRequest(http.MethodGet, "https://"+s.addr+"/workers", nil)
		if key != "" {
			req.Header.Set("X-API-Key", key)
		}
		resp, err := client.Do(req)
		if err != nil {
			return -1, nil
		}
		defer resp.Body.Close()
		var out struct{ Workers []string }
		_ = json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out.Workers
	}
	if code, _ := workers(""); code != 401 {
		t.Fatalf("/workers without a key under --ops-auth: %d", code)
	}
	s.eventually("the agent with the CA connected over wss", func() bool {
		_, ids := workers("k")
		return len(ids) == 1 && ids[0] == "tls-agent"
	})
	code, a := post(t, client, "https://"+s.addr+"/run-task", task("tls-1", "model-a", ""), "X-API-Key", "k")
	if code != 200 || a.WorkerID != "tls-agent" {
		t.Fatalf("task over https: %d %+v", code, a)
	}
	s.eventually("the agent's records reached the collector over wss", func() bool {
		return countWith(collectorLines(t, logDir, "tls-agent"), `"task_id":"tls-1"`) > 0
	})
	s.eventually("the agent without the CA failed certificate checks", func() bool {
		return grepLog(t, untrusting, "certificate signed by unknown authority") > 0
	})
	if _, ids := workers("k"); len(ids) != 1 {
		t.Fatalf("workers %v: the agent without the CA connected", ids)
	}
	// Plain HTTP to the TLS port is not served.
	if resp, err := http.Get("http://" + s.addr + "/health"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Fatal("the TLS dispatcher answered plain HTTP")
		}
	}
}
