// Package certfile serves a TLS key pair read from files and takes a renewed pair
// without a restart: cert-manager, and Kubernetes Secret volumes generally, replace
// the files in place well before the old certificate expires.
package certfile

import (
	"crypto/tls"
	"fmt"
	"os"
	"sync"
	"time"
)

// CheckEvery is how often the files are looked at again, at most: a stat of each on
// the first handshake after it, not on every handshake.
const CheckEvery = 10 * time.Second

// Reloader holds the key pair of CertFile and KeyFile. Use GetCertificate as
// tls.Config.GetCertificate.
type Reloader struct {
	certFile, keyFile string
	// OnReload, when set, is told of each pair taken after the first (err nil) and of
	// each changed pair that could not be read (err set; the previous pair is kept,
	// and the files are read again once they change again).
	OnReload func(err error)
	// now is the clock; tests set it.
	now func() time.Time

	mu      sync.Mutex
	cert    *tls.Certificate
	seen    [2]fileStamp // of certFile and keyFile when cert was read, or last tried
	checked time.Time
}

// fileStamp tells a file's versions apart: a Secret volume swaps in a new file, with
// its own modification time and, usually, size.
type fileStamp struct {
	mod  time.Time
	size int64
}

// Load reads the pair: an error here is a start error, not a failed first handshake.
func Load(certFile, keyFile string) (*Reloader, error) {
	r := &Reloader{certFile: certFile, keyFile: keyFile, now: time.Now}
	stamps, err := r.stamps()
	if err != nil {
		return nil, err
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	r.cert, r.seen, r.checked = &cert, stamps, r.now()
	return r, nil
}

func (r *Reloader) stamps() ([2]fileStamp, error) {
	var out [2]fileStamp
	for i, name := range []string{r.certFile, r.keyFile} {
		st, err := os.Stat(name)
		if err != nil {
			return out, err
		}
		out[i] = fileStamp{st.ModTime(), st.Size()}
	}
	return out, nil
}

// GetCertificate returns the current pair, reading the files again when they have
// changed since they were last read (looked at no more than once per CheckEvery).
func (r *Reloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if now := r.now(); now.Sub(r.checked) >= CheckEvery {
		r.checked = now
		r.reloadLocked()
	}
	return r.cert, nil
}

func (r *Reloader) reloadLocked() {
	stamps, err := r.stamps()
	if err != nil || stamps == r.seen {
		return // a file missing for a moment (being swapped): keep the pair
	}
	r.seen = stamps // a bad pair is not read again until the files change again
	cert, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		// Half swapped (new certificate, old key), or broken: keep serving the old pair.
		err = fmt.Errorf("TLS key pair %s, %s changed and cannot be read (the previous one is kept): %w", r.certFile, r.keyFile, err)
	} else {
		r.cert = &cert
	}
	if r.OnReload != nil {
		r.OnReload(err)
	}
}
