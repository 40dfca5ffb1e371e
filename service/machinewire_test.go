package service

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
)

// The hand encoding of a Machine (and a TransitionAck around one) is byte
// for byte what a deterministic proto.Marshal writes, for the machines the
// service builds and for random ones with every field's edge cases: empty
// and absent maps and messages, empty keys and values, -0, NaN and
// negative enums.
func TestMachineEncodingMatchesProto(t *testing.T) {
	det := proto.MarshalOptions{Deterministic: true}
	check := func(name string, m *pb.Machine) {
		t.Helper()
		if !handEncodable(m) {
			t.Fatalf("%s: not hand-encodable: %v", name, m)
		}
		want, err := det.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if got := marshalMachine(m); !bytes.Equal(got, want) {
			t.Fatalf("%s: hand encoding differs\n got %x\nwant %x\nmsg %v", name, got, want, m)
		}
		framed := frameMachine(m)
		frame := protowire.AppendBytes(protowire.AppendTag(nil, machinesField, protowire.BytesType), want)
		if !bytes.Equal(framed, frame) || cap(framed) != len(framed) {
			t.Fatalf("%s: framed encoding differs or is not exact (len %d cap %d)", name, len(framed), cap(framed))
		}
		for _, op := range []string{"", "op-1", "é"} {
			a := &pb.TransitionAck{OperationId: op, Machine: m}
			wantAck, err := det.Marshal(a)
			if err != nil {
				t.Fatal(err)
			}
			if !handEncodableAck(a) || !bytes.Equal(marshalAck(a), wantAck) {
				t.Fatalf("%s: ack encoding differs", name)
			}
		}
	}

	s := fleet(t, 20)
	l, err := s.List(context.Background(), &pb.ListFilter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range l.Machines {
		check("fleet "+m.Id, m)
	}

	r := rand.New(rand.NewPCG(1, 2))
	str := func() string {
		switch r.IntN(4) {
		case 0:
			return ""
		case 1:
			return "é≠" + fmt.Sprint(r.IntN(1000))
		default:
			return string(bytes.Repeat([]byte{'a' + byte(r.IntN(26))}, r.IntN(200)))
		}
	}
	strMap := func() map[string]string {
		switch r.IntN(4) {
		case 0:
			return nil
		case 1:
			return map[string]string{}
		}
		m := map[string]string{}
		for range r.IntN(40) {
			m[str()] = str()
		}
		return m
	}
	dbl := func() float64 {
		return []float64{0, math.Copysign(0, -1), math.NaN(), math.Inf(1), 0.0092, -3, 1e300}[r.IntN(7)]
	}
	res := func() *pb.Resources {
		if r.IntN(4) == 0 {
			return nil
		}
		return &pb.Resources{Resources: strMap()}
	}
	for i := range 3000 {
		m := &pb.Machine{
			Id: str(), State: pb.MachineState(r.IntN(9) - 1), InstanceType: str(), Zone: str(),
			CapacityType: pb.CapacityType(r.IntN(4) - 1), PricePerHour: dbl(), InterruptionProbability: dbl(),
			Resources: res(), Labels: strMap(), LastError: str(), Allocatable: res(), Cluster: str(), ShardMetadata: strMap(),
		}
		if r.IntN(2) == 0 {
			m.Host = &pb.HostRef{Provider: str(), Ref: str()}
		}
		check(fmt.Sprint("random ", i), m)
	}
}

// Messages the hand encoding does not cover go through proto: invalid
// UTF-8 (which proto refuses) and unknown fields.
func TestMachineEncodingFallsBack(t *testing.T) {
	for name, m := range map[string]*pb.Machine{
		"id":            {Id: "\xff"},
		"label key":     {Labels: map[string]string{"\xff": "v"}},
		"label value":   {Labels: map[string]string{"k": "\xc3\x28"}},
		"host":          {Host: &pb.HostRef{Ref: "\xff"}},
		"allocatable":   {Allocatable: &pb.Resources{Resources: map[string]string{"cpu": "\xff"}}},
		"shard meta":    {ShardMetadata: map[string]string{"\xff": ""}},
		"resources key": {Resources: &pb.Resources{Resources: map[string]string{"\xfe": "1"}}},
	} {
		if handEncodable(m) || handEncodableAck(&pb.TransitionAck{Machine: m}) {
			t.Errorf("%s: hand-encodable", name)
		}
	}
	if handEncodableAck(&pb.TransitionAck{OperationId: "\xff"}) {
		t.Error("ack with an invalid operation id: hand-encodable")
	}
	unknown := &pb.Machine{Id: "x"}
	unknown.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 1))
	if handEncodable(unknown) {
		t.Error("unknown fields: hand-encodable")
	}
	// The codec still sends such a message as proto would (a valid one).
	codec := New(nil, "p").Codec()
	buf, err := codec.Marshal(unknown)
	if err != nil {
		t.Fatal(err)
	}
	var back pb.Machine
	if err := proto.Unmarshal(buf.Materialize(), &back); err != nil || !proto.Equal(&back, unknown) {
		t.Errorf("codec fallback: %v %v", err, &back)
	}
}

// A field added to Machine (or HostRef, Resources, TransitionAck) in the
// wire schema must be taught to the hand encoding, or answers would
// silently lose it: a message with every field set (through its
// descriptor, so a new field is set too) encodes as proto encodes it.
func TestMachineEncodingKnowsEveryField(t *testing.T) {
	m := &pb.Machine{}
	fillMessage(t, m.ProtoReflect())
	want, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if !handEncodable(m) || !bytes.Equal(marshalMachine(m), want) {
		t.Fatalf("the hand encoding misses a field of %v", m)
	}
	a := &pb.TransitionAck{}
	fillMessage(t, a.ProtoReflect())
	wantAck, err := proto.MarshalOptions{Deterministic: true}.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	if !handEncodableAck(a) || !bytes.Equal(marshalAck(a), wantAck) {
		t.Fatalf("the hand encoding misses a field of %v", a)
	}
}

// fillMessage sets every field of m to a value that is not its default,
// and fails on a kind it does not know.
func fillMessage(t *testing.T, m protoreflect.Message) {
	t.Helper()
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		switch {
		case fd.IsMap():
			if fd.MapKey().Kind() != protoreflect.StringKind || fd.MapValue().Kind() != protoreflect.StringKind {
				t.Fatalf("%s: a map of %s to %s, unknown to this test", fd.FullName(), fd.MapKey().Kind(), fd.MapValue().Kind())
			}
			m.Mutable(fd).Map().Set(protoreflect.ValueOfString("k").MapKey(), protoreflect.ValueOfString("v"))
		case fd.IsList():
			t.Fatalf("%s: a repeated field, unknown to this test (and to the hand encoding)", fd.FullName())
		case fd.Kind() == protoreflect.MessageKind:
			fillMessage(t, m.Mutable(fd).Message())
		case fd.Kind() == protoreflect.StringKind:
			m.Set(fd, protoreflect.ValueOfString("x"))
		case fd.Kind() == protoreflect.EnumKind:
			m.Set(fd, protoreflect.ValueOfEnum(1))
		case fd.Kind() == protoreflect.DoubleKind:
			m.Set(fd, protoreflect.ValueOfFloat64(1.5))
		default:
			t.Fatalf("%s: kind %s unknown to this test (and to the hand encoding)", fd.FullName(), fd.Kind())
		}
	}
}

// A machine value's List entry is encoded when a List first needs it: a
// Get answer is encoded by the codec, and a value only ever shown in Gets
// (a walk's) was encoded a second time for nothing. Once built, the entry
// is the one every List reuses.
func TestListEntryEncodedOnlyForLists(t *testing.T) {
	s := fleet(t, 3)
	ctx := context.Background()
	doc, err := s.docs.Document()
	if err != nil {
		t.Fatal(err)
	}
	id := doc.All()[0].ID
	if _, err := s.Get(ctx, &pb.MachineRef{Id: id}); err != nil {
		t.Fatal(err)
	}
	w := s.wire(doc.Get(id))
	if w.framed != nil {
		t.Fatal("a Get encoded the machine's List entry")
	}
	if _, err := s.List(ctx, &pb.ListFilter{}); err != nil {
		t.Fatal(err)
	}
	entry := w.framed
	if entry == nil {
		t.Fatal("a List did not encode the machine's List entry")
	}
	if _, err := s.List(ctx, &pb.ListFilter{}); err != nil {
		t.Fatal(err)
	}
	if &w.entry()[0] != &entry[0] {
		t.Error("a second List encoded the entry again")
	}
}
