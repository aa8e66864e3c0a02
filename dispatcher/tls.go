package dispatcher

import (
	"crypto/tls"
	"fmt"

	"github.com/smartroute/smartroute/proto/certfile"
)

// serverTLS loads TLSCert and TLSKey at New, so that a bad file is a start error
// rather than a failure of the first connection. A renewed pair in the same files is
// served without a restart (certfile). Nil when TLS is off.
func serverTLS(cfg Config) (*tls.Config, error) {
	if cfg.TLSCert == "" {
		return nil, nil
	}
	pair, err := certfile.Load(cfg.TLSCert, cfg.TLSKey)
	if err != nil {
		return nil, fmt.Errorf("TLSCert/TLSKey: %w", err)
	}
	log := cfg.Logger.With().Str("component", "tls").Logger()
	pair.OnReload = func(err error) {
		if err != nil {
			log.Error().Err(err).Msg("renewed TLS certificate not taken")
			return
		}
		log.Info().Str("cert_file", cfg.TLSCert).Msg("renewed TLS certificate taken")
	}
	return &tls.Config{
		GetCertificate: pair.GetCertificate,
		MinVersion:     tls.VersionTLS12,
		// WebSocket upgrades need HTTP/1.1; net/http's HTTP/2 cannot hijack.
		NextProtos: []string{"http/1.1"},
	}, nil
}
