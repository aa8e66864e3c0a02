package frame

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"testing/iotest"

	"google.golang.org/protobuf/proto"

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
		if err != nil {
			return
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
