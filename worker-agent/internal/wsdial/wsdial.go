// Package wsdial makes a WebSocket dial that a context can cut at any point of the
// handshake. gorilla/websocket (the v1.5.4 pseudo-version the workspace builds) heeds
// the dial's context only while connecting and in TLS: a peer (or a proxy) that takes
// the connection and never answers the upgrade holds the dial for HandshakeTimeout.
package wsdial

import (
	"context"
	"net"

	"github.com/gorilla/websocket"
)

// Watched returns a copy of d whose connections are closed when stop ends, from the
// moment each exists, and unwatch, which ends that watch (a no-op before a connection
// exists). d's own NetDialContext still dials, or a plain net.Dialer without one. The
// dial must be made on the calling goroutine, before unwatch is called.
func Watched(d *websocket.Dialer, stop context.Context) (watched *websocket.Dialer, unwatch func()) {
	var stopWatch func() bool
	w := *d
	dial := d.NetDialContext
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	w.NetDialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err == nil {
			stopWatch = context.AfterFunc(stop, func() { _ = c.Close() })
		}
		return c, err
	}
	return &w, func() {
		if stopWatch != nil {
			stopWatch()
		}
	}
}
