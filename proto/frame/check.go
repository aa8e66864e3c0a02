package frame

import (
	"fmt"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"

	pb "github.com/smartroute/smartroute/proto/smartroutev1"
)

// invalidUTF8 names the first string field of env that is not valid UTF-8, or returns
// "". Proto3 strings must be UTF-8; protobuf's reflection-based codec enforces it, the
// generated one does not. TestInvalidUTF8CoversEveryStringField walks the schema so
// that a string field added to a frame without a check here fails the build.
func invalidUTF8(env *pb.Envelope) string {
	switch b := env.Body.(type) {
	case *pb.Envelope_Hello:
		h := b.Hello
		switch {
		case !utf8.ValidString(h.GetWorkerId()):
			return "hello.worker_id"
		case !utf8.ValidString(h.GetAgent()):
			return "hello.agent"
		case !validStrings(h.GetHeldLabels()):
			return "hello.held_labels"
		case !validStrings(h.GetLoadableLabels()):
			return "hello.loadable_labels"
		}
	case *pb.Envelope_Welcome:
		if !utf8.ValidString(b.Welcome.GetDispatcherId()) {
			return "welcome.dispatcher_id"
		}
	case *pb.Envelope_Assignment:
		a := b.Assignment
		switch {
		case !utf8.ValidString(a.GetTaskId()):
			return "assignment.task_id"
		case !utf8.ValidString(a.GetTaskType()):
			return "assignment.task_type"
		case !utf8.ValidString(a.GetLabel()):
			return "assignment.label"
		case !utf8.ValidString(a.GetEvictLabel()):
			return "assignment.evict_label"
		}
	case *pb.Envelope_Result:
		r := b.Result
		switch {
		case !utf8.ValidString(r.GetTaskId()):
			return "result.task_id"
		case !utf8.ValidString(r.GetError()):
			return "result.error"
		case !utf8.ValidString(r.GetEvictedLabel()):
			return "result.evicted_label"
		}
	case *pb.Envelope_LabelEvent:
		e := b.LabelEvent
		switch {
		case !utf8.ValidString(e.GetLabel()):
			return "label_event.label"
		case !utf8.ValidString(e.GetError()):
			return "label_event.error"
		}
	case *pb.Envelope_Status:
		if !utf8.ValidString(b.Status.GetReason()) {
			return "status.reason"
		}
	case *pb.Envelope_Cancel:
		c := b.Cancel
		switch {
		case !utf8.ValidString(c.GetTaskId()):
			return "cancel.task_id"
		case !utf8.ValidString(c.GetReason()):
			return "cancel.reason"
		}
	case *pb.Envelope_Drain:
		if !utf8.ValidString(b.Drain.GetReason()) {
			return "drain.reason"
		}
	}
	return ""
}

func validStrings(ss []string) bool {
	for _, s := range ss {
		if !utf8.ValidString(s) {
			return false
		}
	}
	return true
}

// checkWire walks a frame's wire format as protobuf's own decoder would check it. An
// envelope's fields are all messages (the body), so at the top level their contents
// are walked too; bodies hold no messages of their own.
func checkWire(b []byte, envelope bool) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		if num > protowire.MaxValidNumber {
			return fmt.Errorf("field number %d out of range", num)
		}
		b = b[n:]
		if envelope && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			if err := checkWire(v, false); err != nil {
				return err
			}
			b = b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
	}
	return nil
}
