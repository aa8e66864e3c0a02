package frame

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	pb "github.com/smartroute/smartroute/proto/smartroutev1"
)

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	in := &pb.Envelope{Body: &pb.Envelope_Assignment{Assignment: &pb.TaskAssignment{
		TaskId: "t1", Attempt: 2, TaskType: "embed_texts", Label: "m", ParametersJson: []byte(`{"a":1}`), EvictLabel: "old",
	}}}
	b, err := Encode(nil, in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := Decode(b, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(in, out) {
		t.Fatalf("round trip changed the envelope: %v != %v", in, out)
	}
}

func TestDecodeRefuses(t *testing.T) {
	t.Parallel()
	empty, _ := proto.Marshal(&pb.Envelope{})
	cases := []struct {
		name string
		in   []byte
		max  int
		want error
	}{
		{"empty", nil, 0, ErrEmpty},
		{"too large", make([]byte, 11), 10, ErrTooLarge},
		{"garbage", []byte{0xff, 0xff, 0xff}, 0, ErrMalformed},
		{"no body", append(empty, 0x98, 0x06, 0x01), 0, ErrNoBody}, // only an unknown field 99
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := Decode(c.in, c.max); !errors.Is(err, c.want) {
				t.Fatalf("Decode(%x) = %v, want %v", c.in, err, c.want)
			}
		})
	}
}

func TestCheckHello(t *testing.T) {
	t.Parallel()
	good := func() *pb.Hello {
		return &pb.Hello{ProtocolVersion: ProtocolVersion, WorkerId: "w1", MaxLabels: 2, Slots: 1}
	}
	wrap := func(h *pb.Hello) *pb.Envelope { return &pb.Envelope{Body: &pb.Envelope_Hello{Hello: h}} }
	if _, err := CheckHello(wrap(good()), "w1"); err != nil {
		t.Fatalf("good hello refused: %v", err)
	}
	old := good()
	old.ProtocolVersion = 0
	var verr *VersionError
	if _, err := CheckHello(wrap(old), "w1"); !errors.As(err, &verr) {
		t.Fatalf("old version: got %v, want a VersionError", err)
	}
	if _, err := CheckHello(wrap(good()), "w2"); err == nil {
		t.Fatal("worker id mismatch accepted")
	}
	noCap := good()
	noCap.MaxLabels = 0
	if _, err := CheckHello(wrap(noCap), "w1"); err == nil {
		t.Fatal("max_labels 0 accepted")
	}
	if _, err := CheckHello(&pb.Envelope{Body: &pb.Envelope_Drain{Drain: &pb.Drain{}}}, "w1"); err == nil {
		t.Fatal("non-hello first frame accepted")
	}
	// Bounds, so that one hello cannot hold the dispatcher's routing for seconds (its
	// lists are handled under the hub's lock): capacities as the agent allows them,
	// lists of labels a task could name, no longer than that many.
	many := make([]string, MaxListedLabels+1)
	for i := range many {
		many[i] = fmt.Sprintf("l%d", i)
	}
	for name, c := range map[string]struct {
		edit func(*pb.Hello)
		want string
	}{
		"max_labels":     {func(h *pb.Hello) { h.MaxLabels = MaxCapacity + 1 }, "max_labels"},
		"slots":          {func(h *pb.Hello) { h.Slots = MaxCapacity + 1 }, "slots"},
		"held count":     {func(h *pb.Hello) { h.HeldLabels = many }, "held_labels"},
		"loadable count": {func(h *pb.Hello) { h.LoadableLabels = many }, "loadable_labels"},
		"empty label":    {func(h *pb.Hello) { h.HeldLabels = []string{"a", ""} }, "held_labels"},
		"long label":     {func(h *pb.Hello) { h.LoadableLabels = []string{strings.Repeat("x", MaxLabelBytes+1)} }, "loadable_labels"},
		"agent too long": {func(h *pb.Hello) { h.Agent = strings.Repeat("v", MaxAgentBytes+1) }, "agent"},
	} {
		h := good()
		c.edit(h)
		if _, err := CheckHello(wrap(h), "w1"); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error naming %s", name, err, c.want)
		}
	}
	edge := good()
	edge.MaxLabels, edge.Slots = MaxCapacity, MaxCapacity
	edge.HeldLabels, edge.LoadableLabels = many[:MaxListedLabels], []string{strings.Repeat("x", MaxLabelBytes)}
	if _, err := CheckHello(wrap(edge), "w1"); err != nil {
		t.Errorf("a hello at every bound refused: %v", err)
	}
}

// FuzzDecode: no input may panic, and whatever decodes must encode and decode again
// to the same envelope.
func FuzzDecode(f *testing.F) {
	for _, env := range []*pb.Envelope{
		{Body: &pb.Envelope_Hello{Hello: &pb.Hello{ProtocolVersion: ProtocolVersion, WorkerId: "w", MaxLabels: 2, Slots: 1, HeldLabels: []string{"a"}}}},
		{Body: &pb.Envelope_Result{Result: &pb.TaskResult{TaskId: "t", Attempt: 1, Ok: true, Result: []byte("{}"), LabelMiss: true}}},
		{Body: &pb.Envelope_LabelEvent{LabelEvent: &pb.LabelEvent{Kind: pb.LabelEvent_KIND_LOADED, Label: "a"}}},
		{Body: &pb.Envelope_Status{Status: &pb.WorkerStatus{Accepting: true}}},
	} {
		b, _ := Encode(nil, env)
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{0x0a, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		env, err := Decode(b, 1<<16)
		// The generated (vtprotobuf) decoder, with frame's own checks, must be as
		// strict as protobuf's own and, where both accept, agree with it field for
		// field (unknown fields aside: protobuf's is told to discard them).
		std := new(pb.Envelope)
		stdErr := proto.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(b, std)
		if stdErr != nil {
			if err == nil {
				t.Fatalf("accepted a frame protobuf refuses (%v): %v", stdErr, env)
			}
			return
		}
		if err != nil {
			return
		}
		mine := proto.Clone(env)
		discardUnknown(mine.ProtoReflect())
		if !proto.Equal(mine, std) {
			t.Fatalf("decoded %v, protobuf decoded %v", mine, std)
		}
		again, err := Encode(nil, env)
		if err != nil {
			t.Fatalf("decoded envelope does not encode: %v", err)
		}
		env2, err := Decode(again, 1<<20)
		if err != nil || !proto.Equal(env, env2) {
			t.Fatalf("re-decode differs: %v", err)
		}
	})
}

func discardUnknown(m protoreflect.Message) {
	m.SetUnknown(nil)
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Message() != nil && !fd.IsList() && !fd.IsMap() {
			discardUnknown(v.Message())
		}
		return true
	})
}

// Every string field of every frame body is checked for UTF-8 on the way in and out:
// the schema is walked, so a string field added without a check in invalidUTF8 fails
// here.
func TestInvalidUTF8CoversEveryStringField(t *testing.T) {
	t.Parallel()
	bodies := (&pb.Envelope{}).ProtoReflect().Descriptor().Oneofs().ByName("body").Fields()
	checked := 0
	for i := range bodies.Len() {
		body := bodies.Get(i)
		fields := body.Message().Fields()
		for j := range fields.Len() {
			fd := fields.Get(j)
			if fd.Kind() != protoreflect.StringKind {
				continue
			}
			checked++
			name := string(body.Name()) + "." + string(fd.Name())
			// On the wire: the body holding one bad string.
			inner := protowire.AppendTag(nil, fd.Number(), protowire.BytesType)
			inner = protowire.AppendBytes(inner, []byte("ok\xffno"))
			b := protowire.AppendTag(nil, body.Number(), protowire.BytesType)
			b = protowire.AppendBytes(b, inner)
			env, err := Decode(b, 0)
			if !errors.Is(err, ErrMalformed) {
				t.Errorf("%s: decode of invalid UTF-8 = %v, %v; want ErrMalformed", name, env, err)
				continue
			}
			// And in memory: Encode refuses it rather than send what the peer refuses.
			env = &pb.Envelope{}
			msg := dynamicBody(env, body)
			if fd.IsList() {
				msg.Mutable(fd).List().Append(protoreflect.ValueOfString("ok\xffno"))
			} else {
				msg.Set(fd, protoreflect.ValueOfString("ok\xffno"))
			}
			if _, err := Encode(nil, env); err == nil {
				t.Errorf("%s: encode of invalid UTF-8 succeeded", name)
			}
		}
	}
	if checked < 18 { // as of protocol version 1
		t.Fatalf("only %d string fields found: the walk is broken", checked)
	}
}

// dynamicBody sets env's body to a new message of the oneof field's type and
// returns it.
func dynamicBody(env *pb.Envelope, body protoreflect.FieldDescriptor) protoreflect.Message {
	m := env.ProtoReflect()
	v := m.NewField(body)
	m.Set(body, v)
	return v.Message()
}

// ReadInto decodes what it reads, tells a failed read from a bad frame, and leaves
// nothing of one frame in the next.
func TestReadInto(t *testing.T) {
	t.Parallel()
	b, err := Encode(nil, &pb.Envelope{Body: &pb.Envelope_Result{Result: &pb.TaskResult{TaskId: "t-1", Result: []byte("long result")}}})
	if err != nil {
		t.Fatal(err)
	}
	env := new(pb.Envelope)
	if n, err := ReadInto(bytes.NewReader(b), 0, env); err != nil || n != len(b) || env.GetResult().GetTaskId() != "t-1" {
		t.Fatalf("ReadInto = %d, %v; env %v", n, err, env)
	}
	kept := env.GetResult().GetResult()
	small, _ := Encode(nil, &pb.Envelope{Body: &pb.Envelope_Result{Result: &pb.TaskResult{TaskId: "t-2"}}})
	env2 := new(pb.Envelope)
	if _, err := ReadInto(bytes.NewReader(small), 0, env2); err != nil || env2.GetResult().GetTaskId() != "t-2" {
		t.Fatalf("second frame: %v %v", err, env2)
	}
	if string(kept) != "long result" {
		t.Fatalf("a decoded field aliased the pooled buffer: now %q", kept)
	}
	var re *ReadError
	if _, err := ReadInto(iotest.ErrReader(io.ErrUnexpectedEOF), 0, env); !errors.As(err, &re) {
		t.Fatalf("failed read: %v, want a *ReadError", err)
	}
	if _, err := ReadInto(bytes.NewReader([]byte{0xff, 0xff}), 0, env); err == nil || errors.As(err, &re) {
		t.Fatalf("garbage: %v, want a decoding error", err)
	}
}

// A reader decodes its results into one message: nothing of a result survives into
// the next one, and a frame of another kind replaces it.
func TestDecodeIntoReusesResult(t *testing.T) {
	t.Parallel()
	first := &pb.TaskResult{TaskId: "t-1", Attempt: 2, Ok: true, Result: []byte(`{"long":"result"}`), Error: "e",
		LabelMiss: true, LoadDurationUs: 5, RunDurationUs: 6, EvictedLabel: "old", Refused: true, DeadlineExceeded: true, LoadFailed: true}
	encode := func(env *pb.Envelope) []byte {
		t.Helper()
		b, err := Encode(nil, env)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	env := new(pb.Envelope)
	if err := DecodeInto(encode(&pb.Envelope{Body: &pb.Envelope_Result{Result: first}}), 0, env); err != nil {
		t.Fatal(err)
	}
	res := env.GetResult()
	if !proto.Equal(res, first) {
		t.Fatalf("first result decoded as %v", res)
	}
	if err := DecodeInto(encode(&pb.Envelope{Body: &pb.Envelope_Result{Result: &pb.TaskResult{TaskId: "t-2", Result: []byte("x")}}}), 0, env); err != nil {
		t.Fatal(err)
	}
	if env.GetResult() != res {
		t.Error("the second result got a new message; the first one's was to be reused")
	}
	if want := (&pb.TaskResult{TaskId: "t-2", Result: []byte("x")}); !proto.Equal(env.GetResult(), want) {
		t.Errorf("second result decoded as %v, want %v", env.GetResult(), want)
	}
	if err := DecodeInto(encode(&pb.Envelope{Body: &pb.Envelope_Status{Status: &pb.WorkerStatus{}}}), 0, env); err != nil {
		t.Fatal(err)
	}
	if env.GetResult() != nil || env.GetStatus() == nil {
		t.Errorf("a status frame decoded as %v", env)
	}
}

func TestCheckWorkerIDField(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		id, want string // want "": accepted
	}{
		{"worker-1", ""},
		{strings.Repeat("~", MaxWorkerIDBytes), ""},
		{"", "Worker-Id is required"},
		{strings.Repeat("w", MaxWorkerIDBytes+1), "Worker-Id is 257 bytes long, the limit is 256"},
		{"w 1", "Worker-Id may hold only printable ASCII without spaces (byte 1 is 0x20)"},
		{"w\x7f", "Worker-Id may hold only printable ASCII without spaces (byte 1 is 0x7f)"},
		{"wö", "Worker-Id may hold only printable ASCII without spaces (byte 1 is 0xc3)"},
	} {
		err := CheckWorkerIDField("Worker-Id", tc.id)
		if got := fmt.Sprint(err); tc.want == "" && err != nil || tc.want != "" && got != tc.want {
			t.Errorf("CheckWorkerIDField(%q) = %v, want %q", tc.id, err, tc.want)
		}
		// CheckWorkerID is the same rule.
		if (CheckWorkerID(tc.id) == nil) != (err == nil) {
			t.Errorf("CheckWorkerID(%q) = %v, CheckWorkerIDField %v", tc.id, CheckWorkerID(tc.id), err)
		}
	}
}

// A frame with no body this build knows is ErrNoBody also when decoded into an
// envelope whose body reset keeps (a result's, an assignment's): that body is not
// the frame's.
func TestNoBodyIntoAKeptBody(t *testing.T) {
	t.Parallel()
	unknownOnly := []byte{0x98, 0x06, 0x01} // only an unknown field 99
	for _, first := range []*pb.Envelope{
		{Body: &pb.Envelope_Result{Result: &pb.TaskResult{TaskId: "t-1"}}},
		{Body: &pb.Envelope_Assignment{Assignment: &pb.TaskAssignment{TaskId: "t-1", Label: "a"}}},
	} {
		b, err := Encode(nil, first)
		if err != nil {
			t.Fatal(err)
		}
		env := new(pb.Envelope)
		if err := DecodeInto(b, 0, env); err != nil {
			t.Fatal(err)
		}
		if err := DecodeInto(unknownOnly, 0, env); !errors.Is(err, ErrNoBody) {
			t.Errorf("after a %T: %v, want ErrNoBody", first.GetBody(), err)
		}
	}
}

// An agent decodes each assignment into the body it made beside the envelope.
func TestDecodeIntoKeepsAssignmentBody(t *testing.T) {
	t.Parallel()
	want := &pb.TaskAssignment{TaskId: "t-2", Attempt: 3, TaskType: "x", Label: "b", ParametersJson: []byte(`{}`), DeadlineUnixMs: 7}
	b, err := Encode(nil, &pb.Envelope{Body: &pb.Envelope_Assignment{Assignment: want}})
	if err != nil {
		t.Fatal(err)
	}
	asg := &pb.TaskAssignment{TaskId: "stale", EvictLabel: "stale"}
	env := &pb.Envelope{Body: &pb.Envelope_Assignment{Assignment: asg}}
	if err := DecodeInto(b, 0, env); err != nil {
		t.Fatal(err)
	}
	if env.GetAssignment() != asg {
		t.Error("the assignment got a new message; the envelope's was to be filled")
	}
	if !proto.Equal(asg, want) {
		t.Errorf("decoded %v, want %v", asg, want)
	}
	// Another kind of frame replaces the body.
	c, _ := Encode(nil, &pb.Envelope{Body: &pb.Envelope_Cancel{Cancel: &pb.Cancel{TaskId: "t-2"}}})
	if err := DecodeInto(c, 0, env); err != nil || env.GetCancel().GetTaskId() != "t-2" || env.GetAssignment() != nil {
		t.Errorf("a cancel frame decoded as %v, %v", env, err)
	}
}
