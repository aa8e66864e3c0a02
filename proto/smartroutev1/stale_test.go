package smartroutev1_test

import (
	"context"
	"os"
	"testing"

	"github.com/bufbuild/protocompile"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"

	pb "github.com/smartroute/smartroute/proto/smartroutev1"
)

// TestGeneratedCodeIsFresh compiles each .proto source and compares it with the
// descriptor embedded in the committed .pb.go: a .proto edited without `task proto`
// fails here, on any machine, without buf or protoc installed.
func TestGeneratedCodeIsFresh(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		path      string
		committed protoreflect.FileDescriptor
	}{
		{"smartroute/v1/worker.proto", pb.File_smartroute_v1_worker_proto},
		{"smartroute/v1/logs.proto", pb.File_smartroute_v1_logs_proto},
	} {
		t.Run(tc.path, func(t *testing.T) {
			t.Parallel()
			if _, err := os.Stat("../" + tc.path); err != nil {
				t.Fatalf("proto source not found: %v", err)
			}
			c := protocompile.Compiler{Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{ImportPaths: []string{".."}})}
			files, err := c.Compile(context.Background(), tc.path)
			if err != nil {
				t.Fatalf("compile %s: %v", tc.path, err)
			}
			fromSource := protodesc.ToFileDescriptorProto(files[0])
			fromSource.SourceCodeInfo = nil
			committed := protodesc.ToFileDescriptorProto(tc.committed)
			committed.SourceCodeInfo = nil
			if !proto.Equal(fromSource, committed) {
				t.Fatalf("%s is stale: run `task proto` and commit the result", tc.path)
			}
		})
	}
}
