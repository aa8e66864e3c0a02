package frame

import (
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/smartroute/smartroute/proto/smartroutev1"
)

// BenchmarkTaskFrames is one task's protobuf work across both ends: the dispatcher
// encodes an assignment, the agent decodes it, encodes the result, and the dispatcher
// decodes that. "frame" is this package (generated code plus its checks); "reflection"
// is protobuf's own codec, which frame used before, measured in the same run.
func BenchmarkTaskFrames(b *testing.B) {
	asg := &pb.Envelope{Body: &pb.Envelope_Assignment{Assignment: &pb.TaskAssignment{
		TaskId: "wrk-1-12345", Attempt: 1, TaskType: "sample_task", Label: "label-3",
		ParametersJson: []byte(`{"data": "sample"}`), DeadlineUnixMs: 1763840000000}}}
	res := &pb.Envelope{Body: &pb.Envelope_Result{Result: &pb.TaskResult{
		TaskId: "wrk-1-12345", Attempt: 1, Ok: true, RunDurationUs: 3,
		Result: []byte(`{"task_type":"sample_task","label":"label-3","parameters_json":"{\"data\": \"sample\"}"}`)}}}
	b.Run("frame", func(b *testing.B) {
		b.ReportAllocs()
		var buf []byte
		var env pb.Envelope
		for b.Loop() {
			buf, _ = Encode(buf[:0], asg)
			if err := DecodeInto(buf, 0, &env); err != nil {
				b.Fatal(err)
			}
			buf, _ = Encode(buf[:0], res)
			if err := DecodeInto(buf, 0, &env); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("reflection", func(b *testing.B) {
		b.ReportAllocs()
		var buf []byte
		var env pb.Envelope
		opts := proto.UnmarshalOptions{DiscardUnknown: true}
		for b.Loop() {
			buf, _ = proto.MarshalOptions{}.MarshalAppend(buf[:0], asg)
			env.Reset()
			if err := opts.Unmarshal(buf, &env); err != nil {
				b.Fatal(err)
			}
			buf, _ = proto.MarshalOptions{}.MarshalAppend(buf[:0], res)
			env.Reset()
			if err := opts.Unmarshal(buf, &env); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkDecodeChecks is the wire walk that checks every frame before the generated
// decoder takes it, on a task's two frames.
func BenchmarkDecodeChecks(b *testing.B) {
	asg, _ := Encode(nil, &pb.Envelope{Body: &pb.Envelope_Assignment{Assignment: &pb.TaskAssignment{
		TaskId: "wrk-1-12345", Attempt: 1, TaskType: "sample_task", Label: "label-3",
		ParametersJson: []byte(`{"data": "sample"}`), DeadlineUnixMs: 1763840000000}}})
	res, _ := Encode(nil, &pb.Envelope{Body: &pb.Envelope_Result{Result: &pb.TaskResult{
		TaskId: "wrk-1-12345", Attempt: 1, Ok: true, RunDurationUs: 3,
		Result: []byte(`{"task_type":"sample_task","label":"label-3","parameters_json":"{\"data\": \"sample\"}"}`)}}})
	b.ReportAllocs()
	for b.Loop() {
		if _, err := walkWire(asg, envelopeFields); err != nil {
			b.Fatal(err)
		}
		if _, err := walkWire(res, envelopeFields); err != nil {
			b.Fatal(err)
		}
	}
}
