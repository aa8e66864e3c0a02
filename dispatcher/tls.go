package dispatcher

import (
	"crypto/tls"
	"fmt"
)

// serverTLS loads TLSCert and TLSKey at New, so that a bad file is a start error
// rather than a failure of the first connection. Nil when TLS is off.
func serverTLS(cfg Config) (*tls.Config, error) {
	if cfg.TLSCert == "" {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
	if err != nil {
		return nil, fmt.Errorf("TLSCert/TLSKey: %w", err)
	}
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS12,
		// WebSocket upgrades need HTTP/1.1; net/http's HTTP/2 cannot hijack.
		NextProtos: []string{"http/1.1"},
	}, nil
}
