package smartroutev1_test

import (
	"context"
	"os"
	"testing"

	"github.com/bufbuild/protocompile"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"

	pb "github.com/smartroute/smartroute/proto/smartroutev1"
)

// TestGeneratedCodeIsFresh compiles the .proto source and compares it with the
// descriptor embedded in the committed worker.pb.go: a .proto edited without
// `task proto` fails here, on any machine, without buf or protoc installed.
func TestGeneratedCodeIsFresh(t *testing.T) {
	t.Parallel()
	const path = "smartroute/v1/worker.proto"
	if _, err := os.Stat("../" + path); err != nil {
		t.Fatalf("proto source not found: %v", err)
	}
	c := protocompile.Compiler{Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{ImportPaths: []string{".."}})}
	files, err := c.Compile(context.Background(), path)
	if err != nil {
		t.Fatalf("compile %s: %v", path, err)
	}
	fromSource := protodesc.ToFileDescriptorProto(files[0])
	fromSource.SourceCodeInfo = nil
	committed := protodesc.ToFileDescriptorProto(pb.File_smartroute_v1_worker_proto)
	committed.SourceCodeInfo = nil
	if !proto.Equal(fromSource, committed) {
		t.Fatalf("worker.pb.go is stale: run `task proto` and commit the result")
	}
}
