package service

import (
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
)

// The server codec decodes arbitrary bytes into every request type without
// panicking; whatever it accepts, the strict decoder accepts too once the
// strings are valid UTF-8 (the lenient path only skips UTF-8 checks).
func FuzzDecodeRequest(f *testing.F) {
	for _, m := range []proto.Message{
		&pb.CreateRequest{MachineId: "z/t/000", ShardId: "s", ShardEpoch: -1, SequenceNumber: 5},
		&pb.ConfigureRequest{MachineId: "z/t/000", ClusterId: "c", BootstrapBlob: []byte{0, 1}, ShardMetadata: map[string]string{"k": "v"}},
		&pb.DrainRequest{MachineId: "m", GracePeriodSeconds: 1 << 62},
		&pb.ListFilter{States: []pb.MachineState{1, 3}, MaxResults: 5, SinceRevision: []byte("x")},
	} {
		b, _ := proto.Marshal(m)
		f.Add(b)
	}
	f.Add([]byte{0x0a, 0x01, 0xff})
	codec := New(nil, "p").Codec()
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, m := range []proto.Message{&pb.CreateRequest{}, &pb.ConfigureRequest{}, &pb.DrainRequest{},
			&pb.DeleteRequest{}, &pb.MachineRef{}, &pb.ListFilter{}} {
			_ = codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, m)
		}
	})
}
