package frame

import (
	"fmt"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"

	pb "github.com/smartroute/smartroute/proto/smartroutev1"
)

// invalidUTF8 names the first string field of env that is not valid UTF-8, or returns
// "". Proto3 strings must be UTF-8; protobuf's reflection-based codec enforces it, the
// generated one does not. Encode checks with it; decoding checks on the wire
// (checkWire), where every occurrence of a field is seen. TestInvalidUTF8CoversEveryStringField walks the schema so
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
	case *pb.Envelope_Inventory:
		if !validStrings(b.Inventory.GetLoadableLabels()) {
			return "inventory.loadable_labels"
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

// envelopeDesc is the schema checkWire walks frames against.
var envelopeDesc = (&pb.Envelope{}).ProtoReflect().Descriptor()

// envelopeFields is envelopeDesc as the wire walk reads it.
var envelopeFields = newWireFields(envelopeDesc, map[protoreflect.FullName]*wireFields{})

// wireFields is a message's fields indexed by field number, with what the wire walk
// needs of each: protoreflect's lookup by number (and of the field list) was about
// half of the walk's cost, and the walk is made for every frame at both ends.
type wireFields []wireField

// wireField is one field of a message; fd is nil for a number the message does not
// use.
type wireField struct {
	fd   protoreflect.FieldDescriptor
	kind protoreflect.Kind
	msg  *wireFields // the fields of a message field's message
}

// newWireFields builds md's table; seen holds the tables built or being built, for
// messages that refer to each other.
func newWireFields(md protoreflect.MessageDescriptor, seen map[protoreflect.FullName]*wireFields) *wireFields {
	if t := seen[md.FullName()]; t != nil {
		return t
	}
	t := new(wireFields)
	seen[md.FullName()] = t
	fields := md.Fields()
	top := protowire.Number(0)
	for i := range fields.Len() {
		top = max(top, fields.Get(i).Number())
	}
	*t = make(wireFields, top+1)
	for i := range fields.Len() {
		fd := fields.Get(i)
		f := wireField{fd: fd, kind: fd.Kind()}
		if fd.Kind() == protoreflect.MessageKind {
			f.msg = newWireFields(fd.Message(), seen)
		}
		(*t)[fd.Number()] = f
	}
	return t
}

// field returns the field numbered num, nil when the message has none.
func (t *wireFields) field(num protowire.Number) *wireField {
	if num < 0 || int(num) >= len(*t) || (*t)[num].fd == nil {
		return nil
	}
	return &(*t)[num]
}

// checkWire walks a frame's wire format as protobuf's own decoder checks it, against
// the message fields describe (the envelope at the top): over-long varints, field
// numbers out of range, in fields it skips too; messages are walked into; and every
// occurrence of a string field must be UTF-8. The generated decoder keeps only the
// last occurrence of a field, so checking the decoded message would miss an earlier
// invalid one, which protobuf refuses.
func checkWire(b []byte, fields *wireFields) error {
	_, err := walkWire(b, fields)
	return err
}

// walkWire is checkWire, and also reports whether b holds a length-delimited field
// that the message knows: for an envelope, whose fields are all its body's oneof,
// whether the frame has a body this build knows (a field of another wire type fails
// to decode).
func walkWire(b []byte, fields *wireFields) (known bool, err error) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return known, protowire.ParseError(n)
		}
		if num > protowire.MaxValidNumber {
			return known, fmt.Errorf("field number %d out of range", num)
		}
		b = b[n:]
		if typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return known, protowire.ParseError(n)
			}
			if f := fields.field(num); f != nil {
				known = true
				switch f.kind {
				case protoreflect.StringKind:
					if !utf8.Valid(v) {
						return known, fmt.Errorf("string field %s contains invalid UTF-8", f.fd.FullName())
					}
				case protoreflect.MessageKind:
					if err := checkWire(v, f.msg); err != nil {
						return known, err
					}
				}
			}
			b = b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return known, protowire.ParseError(n)
		}
		b = b[n:]
	}
	return known, nil
}
