package service

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
)

// Every request decodes even with invalid UTF-8 in its strings, into the
// same fields a strict decoder would fill, so the handler can answer
// InvalidArgument (desired checks every string).
func TestCodecDecodesInvalidUTF8Requests(t *testing.T) {
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
	b = protowire.AppendTag(b, 4, protowire.BytesType)
	b = protowire.AppendString(b, "shard\xfe")
	b = protowire.AppendTag(b, 5, protowire.VarintType)
	b = protowire.AppendVarint(b, 7)
	b = protowire.AppendTag(b, 6, protowire.VarintType)
	b = protowire.AppendVarint(b, uint64(1<<64-3)) // -3
	b = protowire.AppendTag(b, 7, protowire.BytesType)
	b = protowire.AppendBytes(b, entry)

	codec := New(nil, "p").Codec()
	var got pb.ConfigureRequest
	if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &got); err != nil {
		t.Fatal(err)
	}
	want := &pb.ConfigureRequest{MachineId: "z/t/000", ClusterId: "c1", BootstrapBlob: []byte{0, 1, 2}, ShardId: "shard\xfe",
		ShardEpoch: 7, SequenceNumber: -3, ShardMetadata: map[string]string{"bad\xffkey": "\xc3\x28"}}
	if diff := cmp.Diff(want, &got, protocmp.Transform()); diff != "" {
		t.Errorf("configure (-want +got):\n%s", diff)
	}
	var create pb.CreateRequest
	if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer([]byte{0x0a, 0x01, 0xff})}, &create); err != nil || create.MachineId != "\xff" {
		t.Errorf("create: %v %q", err, create.MachineId)
	}
	var ref pb.MachineRef
	if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer([]byte{0x0a, 0x02, 0xc3, 0x28})}, &ref); err != nil || ref.Id != "\xc3\x28" {
		t.Errorf("machine ref: %v %q", err, ref.Id)
	}
	// Garbage that is not a message at all still fails.
	if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer([]byte{0x0a, 0x09, 0x01})}, &create); err == nil {
		t.Error("truncated message decoded")
	}
}

// A List answer is a complete message, and the bytes the codec sends for
// it decode to exactly that message, whether its machines are the shared
// pre-encoded ones or an interceptor's own.
func TestListIsHonestAndEncodesExactly(t *testing.T) {
	s := fleet(t, 50)
	l, err := s.List(context.Background(), &pb.ListFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Machines) != 50 || l.Machines[0].GetId() == "" || l.Machines[0].GetAllocatable() == nil || len(l.Revision) == 0 {
		t.Fatalf("List answer is not a populated message: %v", l.Machines[0])
	}
	// An interceptor rebuilds one machine and drops another.
	rebuilt := proto.Clone(l).(*pb.MachineList)
	rebuilt.Machines = rebuilt.Machines[1:]
	rebuilt.Machines[0].Labels = map[string]string{"seen": "by interceptor"}
	mixed := &pb.MachineList{Machines: append([]*pb.Machine{rebuilt.Machines[0]}, l.Machines[2:]...), Revision: l.Revision}
	for name, msg := range map[string]*pb.MachineList{"shared": l, "rebuilt": rebuilt, "mixed": mixed} {
		buf, err := s.Codec().Marshal(msg)
		if err != nil {
			t.Fatal(err)
		}
		var back pb.MachineList
		if err := proto.Unmarshal(buf.Materialize(), &back); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(msg, &back, protocmp.Transform()); diff != "" {
			t.Errorf("%s: wire bytes decode to another message (-sent +decoded):\n%s", name, diff)
		}
	}
	g, err := s.Get(context.Background(), &pb.MachineRef{Id: l.Machines[3].GetId()})
	if err != nil || !proto.Equal(g, l.Machines[3]) {
		t.Errorf("Get: %v %v", err, g)
	}
}
