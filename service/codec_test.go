package service

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/testing/protocmp"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
)

func TestCodecDecodesInvalidUTF8Configure(t *testing.T) {
	entry := protowire.AppendTag(nil, 1, protowire.BytesType)
	entry = protowire.AppendString(entry, "bad\xffkey")
	entry = protowire.AppendTag(entry, 2, protowire.BytesType)
	entry = protowire.AppendString(entry, "\xc3\x28")
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, "z/t/000")
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	b = protowire.AppendString(b, "c1")
	b = protowire.AppendTag(b, 3, protowire.BytesType)
	b = protowire.AppendBytes(b, []byte{0, 1, 2})
	b = protowire.AppendTag(b, 5, protowire.VarintType)
	b = protowire.AppendVarint(b, 7)
	b = protowire.AppendTag(b, 7, protowire.BytesType)
	b = protowire.AppendBytes(b, entry)

	var got pb.ConfigureRequest
	if err := Codec().Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &got); err != nil {
		t.Fatal(err)
	}
	want := &pb.ConfigureRequest{MachineId: "z/t/000", ClusterId: "c1", BootstrapBlob: []byte{0, 1, 2}, ShardEpoch: 7,
		ShardMetadata: map[string]string{"bad\xffkey": "\xc3\x28"}}
	if diff := cmp.Diff(want, &got, protocmp.Transform()); diff != "" {
		t.Errorf("decoded (-want +got):\n%s", diff)
	}
	var other pb.CreateRequest
	if err := Codec().Unmarshal(mem.BufferSlice{mem.SliceBuffer([]byte{0x0a, 0x01, 0xff})}, &other); err == nil {
		t.Error("other messages keep strict decoding")
	}
}
