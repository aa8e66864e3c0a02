package agent

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/gorilla/websocket"

	"github.com/smartroute/smartroute/proto/frame"
	pb "github.com/smartroute/smartroute/proto/smartroutev1"
)

// CloseError is a close frame the dispatcher ended the connection with. Run returns it
// (wrapped) when the code means giving up: REPLACED, PROTOCOL_VERSION.
type CloseError struct {
	// Code is the WebSocket close code; the application codes are pb.CloseCode values.
	Code   int
	Reason string
}

func (e *CloseError) Error() string {
	msg := fmt.Sprintf("dispatcher closed the connection with %s", closeCodeName(e.Code))
	if why := closeCodeMeaning(e.Code); why != "" {
		msg += " (" + why + ")"
	}
	if e.Reason != "" {
		msg += ": " + e.Reason
	}
	return msg
}

func closeCodeName(code int) string {
	if name, ok := pb.CloseCode_name[int32(code)]; ok && code != 0 {
		return fmt.Sprintf("%s (%d)", name, code)
	}
	return "code " + strconv.Itoa(code)
}

func closeCodeMeaning(code int) string {
	switch pb.CloseCode(code) {
	case pb.CloseCode_CLOSE_CODE_REPLACED:
		return "a newer connection with the same worker id took this one's place"
	case pb.CloseCode_CLOSE_CODE_PROTOCOL_VERSION:
		return "the dispatcher does not speak this worker's protocol version " + strconv.Itoa(int(frame.ProtocolVersion))
	case pb.CloseCode_CLOSE_CODE_UNAUTHORIZED:
		return "the dispatcher refused this worker's credentials"
	case pb.CloseCode_CLOSE_CODE_SHUTDOWN:
		return "the dispatcher is shutting down"
	case pb.CloseCode_CLOSE_CODE_SLOW_WORKER:
		return "the worker did not read its frames fast enough"
	case pb.CloseCode_CLOSE_CODE_BAD_FRAME:
		return "the dispatcher could not use a frame from this worker"
	case pb.CloseCode_CLOSE_CODE_HELLO_TIMEOUT:
		return "the hello did not arrive in time"
	}
	return ""
}

// DialError is a refused WebSocket upgrade. A 401 or 403 is retried after a backoff
// (see authRefused).
type DialError struct {
	StatusCode int    // HTTP status of the refused upgrade; 0 when there was no response
	Body       string // start of the response body, often the dispatcher's {"error": ...}
	Err        error
}

func (e *DialError) Error() string {
	if e.StatusCode == 0 {
		return "dial: " + e.Err.Error()
	}
	msg := fmt.Sprintf("dial: upgrade refused with HTTP %d %s", e.StatusCode, http.StatusText(e.StatusCode))
	if e.Body != "" {
		msg += ": " + e.Body
	}
	return msg
}

func (e *DialError) Unwrap() error { return e.Err }

// protocolError is a frame from the dispatcher that this worker cannot use; the
// connection is closed with CLOSE_CODE_BAD_FRAME and re-established after a backoff.
type protocolError struct{ msg string }

func (e *protocolError) Error() string { return "bad frame from dispatcher: " + e.msg }

// fatalError wraps an error that makes Run give up rather than reconnect.
type fatalError struct{ err error }

func (e *fatalError) Error() string { return e.err.Error() }
func (e *fatalError) Unwrap() error { return e.err }

// reconnect says what to do after a connection ended.
type reconnect int

const (
	reconnectAfterBackoff reconnect = iota
	reconnectNow
	giveUp
)

// reconnectPolicy maps why a connection ended to what the agent does next.
func reconnectPolicy(err error) reconnect {
	var fe *fatalError
	if errors.As(err, &fe) {
		return giveUp
	}
	var ce *CloseError
	if errors.As(err, &ce) {
		switch pb.CloseCode(ce.Code) {
		case pb.CloseCode_CLOSE_CODE_REPLACED, pb.CloseCode_CLOSE_CODE_PROTOCOL_VERSION:
			return giveUp
		case pb.CloseCode_CLOSE_CODE_SLOW_WORKER:
			return reconnectNow
		}
	}
	return reconnectAfterBackoff
}

// authRefused reports whether the dispatcher refused this worker's credentials: an
// upgrade answered 401/403, or a connection closed with UNAUTHORIZED (its token was
// revoked). The agent keeps retrying with backoff rather than exiting, so that a fleet
// recovers by itself once an operator fixes the token file and reloads the
// dispatcher; it logs each refusal at error level.
func authRefused(err error) bool {
	var de *DialError
	if errors.As(err, &de) && (de.StatusCode == http.StatusUnauthorized || de.StatusCode == http.StatusForbidden) {
		return true
	}
	var ce *CloseError
	return errors.As(err, &ce) && pb.CloseCode(ce.Code) == pb.CloseCode_CLOSE_CODE_UNAUTHORIZED
}

// asCloseError turns gorilla's close error into ours; other errors pass through.
func asCloseError(err error) error {
	var wce *websocket.CloseError
	if errors.As(err, &wce) {
		return &CloseError{Code: wce.Code, Reason: wce.Text}
	}
	return err
}
