// Package frame encodes and decodes the dispatcher ⇄ worker WebSocket frames: one
// binary frame is one smartroutev1.Envelope. Both ends use it so that what counts as
// a bad frame is decided in one place.
package frame

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"

	pb "github.com/smartroute/smartroute/proto/smartroutev1"
)

// ProtocolVersion is the version this build speaks.
const ProtocolVersion = pb.ProtocolVersion_PROTOCOL_VERSION_CURRENT

// DefaultMaxSize bounds a frame when the caller sets no limit of its own: large enough
// for an inference request or result, small enough that one peer cannot exhaust memory.
const DefaultMaxSize = 16 << 20

// ErrEmpty, ErrTooLarge and ErrNoBody are the ways a frame is refused before or after
// protobuf decoding; decoding errors themselves are wrapped in ErrMalformed.
var (
	ErrEmpty     = errors.New("empty frame")
	ErrTooLarge  = errors.New("frame too large")
	ErrNoBody    = errors.New("envelope has no body")
	ErrMalformed = errors.New("malformed frame")
)

// Decode parses one frame. maxSize <= 0 means DefaultMaxSize. A frame with unknown
// fields decodes (newer peers may add fields); a frame with no known body does not.
func Decode(b []byte, maxSize int) (*pb.Envelope, error) {
	env := new(pb.Envelope)
	if err := DecodeInto(b, maxSize, env); err != nil {
		return nil, err
	}
	return env, nil
}

// DecodeInto is Decode into a caller-owned envelope, so a reader loop can reuse one.
// A result body is decoded into the one env holds, result bytes included: a caller
// that keeps those bytes past the next DecodeInto copies them.
func DecodeInto(b []byte, maxSize int, env *pb.Envelope) error {
	if maxSize <= 0 {
		maxSize = DefaultMaxSize
	}
	switch {
	case len(b) == 0:
		return ErrEmpty
	case len(b) > maxSize:
		return fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, len(b), maxSize)
	}
	// The generated (vtprotobuf) decoder does without reflection, which was most of a
	// frame's cost. It is laxer than protobuf's own in two ways, both checked on the
	// wire first: the wire format (over-long varints, field numbers out of range, in
	// fields it skips too) and UTF-8 in every occurrence of a string field.
	// FuzzDecode holds the two decoders together.
	body, err := walkWire(b, envelopeFields)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	reset(env)
	if err := env.UnmarshalVT(b); err != nil {
		return fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	// Asked of the wire, not of env.Body: a body kept by reset is still there when the
	// frame has none.
	if env.Body == nil || !body {
		return ErrNoBody
	}
	return nil
}

// reset empties env for the next frame but keeps a result body's messages and the
// capacity of its result bytes: nearly every frame a dispatcher reads is a result, and
// the decoder fills a body of the same kind in place rather than allocate one. The
// bytes are kept only up to maxKeptResult, as a worker connection holds them while
// idle. An assignment body's messages are kept too (emptied): nearly every frame an
// agent reads is one, and it decodes each into a fresh envelope whose assignment body
// it made in the same allocation.
func reset(env *pb.Envelope) {
	if asg, ok := env.Body.(*pb.Envelope_Assignment); ok && asg.Assignment != nil {
		env.Reset()
		asg.Assignment.Reset()
		env.Body = asg
		return
	}
	body, ok := env.Body.(*pb.Envelope_Result)
	env.Reset()
	if !ok || body.Result == nil {
		return
	}
	var kept []byte
	if cap(body.Result.Result) <= maxKeptResult {
		kept = body.Result.Result[:0]
	}
	body.Result.Reset()
	body.Result.Result = kept
	env.Body = body
}

const maxKeptResult = 1 << 10

// ReadError is a failure to read a frame off its connection, as opposed to a frame
// that was read and is bad.
type ReadError struct{ Err error }

func (e *ReadError) Error() string { return "read: " + e.Err.Error() }
func (e *ReadError) Unwrap() error { return e.Err }

// readBuffers recycles the buffers frames are read into: decoding copies what it
// keeps, so a buffer is free again once decoded.
var readBuffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// maxKeptRead bounds a read buffer returned to the pool: one huge frame does not pin
// its size.
const maxKeptRead = 64 << 10

// ReadInto reads one frame from r (a WebSocket message's reader, bounded by the
// connection's read limit) and decodes it into env, as DecodeInto. A failed read is a
// *ReadError. The bytes go through a pooled buffer: a reader loop allocates nothing
// for the frame itself, and an idle connection holds no buffer.
func ReadInto(r io.Reader, maxSize int, env *pb.Envelope) (n int, err error) {
	buf := readBuffers.Get().(*bytes.Buffer)
	buf.Reset()
	defer func() {
		if buf.Cap() <= maxKeptRead {
			readBuffers.Put(buf)
		}
	}()
	if _, err := buf.ReadFrom(r); err != nil {
		return buf.Len(), &ReadError{err}
	}
	return buf.Len(), DecodeInto(buf.Bytes(), maxSize, env)
}

// Encode marshals an envelope into a frame, appending to buf (which may be nil).
func Encode(buf []byte, env *pb.Envelope) ([]byte, error) {
	if env.GetBody() == nil {
		return nil, ErrNoBody
	}
	if field := invalidUTF8(env); field != "" {
		return nil, fmt.Errorf("string field %s contains invalid UTF-8", field)
	}
	n := env.SizeVT()
	buf = slices.Grow(buf, n)
	out := buf[len(buf) : len(buf)+n]
	if _, err := env.MarshalToSizedBufferVT(out); err != nil {
		return nil, err
	}
	return buf[:len(buf)+n], nil
}

// MaxWorkerIDBytes bounds a worker id (the Worker-Id header and the hello's).
const MaxWorkerIDBytes = 256

// CheckWorkerID says whether the dispatcher takes id as a worker's id: 1 to
// MaxWorkerIDBytes of visible ASCII. Ids name log directories and metric series, and
// travel in a header.
func CheckWorkerID(id string) error { return CheckWorkerIDField("worker id", id) }

// CheckWorkerIDField is CheckWorkerID with its errors naming field (a header, a query
// parameter) instead of "worker id". The log collector checks ids with it: an id the
// dispatcher takes but the collector refused would be refused on every dial of the
// agent's log shipper, for as long as the worker runs.
func CheckWorkerIDField(field, id string) error {
	if id == "" {
		return fmt.Errorf("%s is required", field)
	}
	if len(id) > MaxWorkerIDBytes {
		return fmt.Errorf("%s is %d bytes long, the limit is %d", field, len(id), MaxWorkerIDBytes)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c <= ' ' || c > '~' {
			return fmt.Errorf("%s may hold only printable ASCII without spaces (byte %d is 0x%02x)", field, i, c)
		}
	}
	return nil
}

// Bounds of what a worker announces. The dispatcher handles a hello's and an
// Inventory's lists under its routing lock, so they are bounded well below what a
// frame could carry: one hello must not hold every task's routing for seconds.
const (
	// MaxCapacity bounds a hello's max_labels and slots (the agent's own limit).
	MaxCapacity = 1 << 16
	// MaxListedLabels bounds each label list of a hello or an Inventory.
	MaxListedLabels = 1 << 16
	// MaxLabelBytes is the longest label a task may name, and so the longest a worker
	// may list or report.
	MaxLabelBytes = 256
	// MaxAgentBytes bounds the hello's free-text agent description, kept per worker.
	MaxAgentBytes = 1024
)

// CheckLabel checks one label a worker names (in a label event): 1 to MaxLabelBytes
// bytes. field names it in the error.
func CheckLabel(field, label string) error {
	if label == "" || len(label) > MaxLabelBytes {
		return fmt.Errorf("%s %.64q is %d bytes long; a label is 1 to %d", field, label, len(label), MaxLabelBytes)
	}
	return nil
}

// CheckLabels checks a list of labels a worker announces (held, loadable): at most
// MaxListedLabels, each one a label CheckLabel takes.
func CheckLabels(field string, labels []string) error {
	if len(labels) > MaxListedLabels {
		return fmt.Errorf("%s lists %d labels, the limit is %d", field, len(labels), MaxListedLabels)
	}
	for i, l := range labels {
		if err := CheckLabel(fmt.Sprintf("%s[%d]", field, i), l); err != nil {
			return err
		}
	}
	return nil
}

// CheckHello validates the first frame of a connection against the Worker-Id header.
func CheckHello(env *pb.Envelope, headerWorkerID string) (*pb.Hello, error) {
	h := env.GetHello()
	if h == nil {
		return nil, fmt.Errorf("first frame must be a hello, got %T", env.GetBody())
	}
	if h.GetProtocolVersion() != ProtocolVersion {
		return nil, &VersionError{Got: h.GetProtocolVersion()}
	}
	if h.GetWorkerId() != headerWorkerID {
		return nil, fmt.Errorf("hello worker_id %q does not match Worker-Id header %q", h.GetWorkerId(), headerWorkerID)
	}
	if h.GetMaxLabels() == 0 || h.GetMaxLabels() > MaxCapacity {
		return nil, fmt.Errorf("hello max_labels must be 1 to %d, got %d", MaxCapacity, h.GetMaxLabels())
	}
	if h.GetSlots() == 0 || h.GetSlots() > MaxCapacity {
		return nil, fmt.Errorf("hello slots must be 1 to %d, got %d", MaxCapacity, h.GetSlots())
	}
	if err := CheckLabels("hello held_labels", h.GetHeldLabels()); err != nil {
		return nil, err
	}
	if err := CheckLabels("hello loadable_labels", h.GetLoadableLabels()); err != nil {
		return nil, err
	}
	if len(h.GetAgent()) > MaxAgentBytes {
		return nil, fmt.Errorf("hello agent is %d bytes long, the limit is %d", len(h.GetAgent()), MaxAgentBytes)
	}
	return h, nil
}

// VersionError says a peer speaks another protocol version.
type VersionError struct{ Got pb.ProtocolVersion }

func (e *VersionError) Error() string {
	return fmt.Sprintf("protocol version %d not supported (this dispatcher speaks %d)", int32(e.Got), int32(ProtocolVersion))
}
