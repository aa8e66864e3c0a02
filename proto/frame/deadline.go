package frame

import "time"

// ReadDeadline extends a connection's read deadline lazily, at most once per eighth
// of its timeout. Setting a deadline is a timer update in the runtime's poller, and
// both ends of a worker connection set one for every frame they read; a liveness
// deadline that ends up to an eighth of its timeout early changes nothing. It belongs
// to the connection's reader goroutine (where gorilla also runs ping and pong
// handlers) and is not safe for concurrent use.
type ReadDeadline struct {
	set func(time.Time) error
	now func() time.Time
	// since is time.Since: with the monotonic reading of at, it reads one clock where
	// now reads two (the wall clock too). Checked for every frame, the deadline itself
	// is set only once in an eighth of the timeout.
	since   func(time.Time) time.Duration
	timeout time.Duration
	at      time.Time // when the deadline was last set
}

// NewReadDeadline returns a ReadDeadline that sets deadlines through set, typically a
// connection's SetReadDeadline.
func NewReadDeadline(set func(time.Time) error) *ReadDeadline {
	return &ReadDeadline{set: set, now: time.Now, since: time.Since}
}

// Extend makes the deadline timeout from now, unless it was set with the same timeout
// less than timeout/8 ago.
func (d *ReadDeadline) Extend(timeout time.Duration) error {
	if timeout == d.timeout && d.since(d.at) < timeout/8 {
		return nil
	}
	now := d.now()
	d.timeout, d.at = timeout, now
	return d.set(now.Add(timeout))
}
