package service

import (
	"fmt"
	"sync"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
)

// Field numbers of MachineList.
const (
	machinesField = 1
	revisionField = 2
)

// wireMachine is one machine value's message and, once a List needs it,
// its encoding framed as a MachineList.machines entry; both are built once
// per immutable value. The encoding waits for a List: a value a client
// only ever sees in a Get or a Create answer (a walk's) is encoded by the
// codec for that answer, and encoding it here as well was work done twice.
type wireMachine struct {
	msg    *pb.Machine
	once   sync.Once
	framed []byte
}

// entry returns the framed encoding, built on first use.
func (w *wireMachine) entry() []byte {
	w.once.Do(func() { w.framed = frameMachine(w.msg) })
	return w.framed
}

// frameMachine encodes msg framed as a MachineList.machines entry, in one
// allocation of its exact size when it takes the hand encoding.
func frameMachine(msg *pb.Machine) []byte {
	if handEncodable(msg) {
		n := sizeMachine(msg)
		framed := protowire.AppendTag(make([]byte, 0, n+1+protowire.SizeVarint(uint64(n))), machinesField, protowire.BytesType)
		return appendMachine(protowire.AppendVarint(framed, uint64(n)), msg)
	}
	raw, err := proto.MarshalOptions{Deterministic: true}.Marshal(msg)
	if err != nil {
		panic("encode machine " + msg.GetId() + ": " + err.Error()) // plain data: cannot fail
	}
	framed := protowire.AppendTag(make([]byte, 0, len(raw)+6), machinesField, protowire.BytesType)
	return protowire.AppendBytes(framed, raw)
}

// Codec returns the server codec: gRPC's proto codec, except that
//   - a List answer the handler returned unchanged is sent as the encoding
//     the handler built (the machines' pre-encoded bytes concatenated: the
//     same bytes a deterministic proto.Marshal produces), shared between
//     concurrent full Lists and counted until gRPC frees it (answers.go);
//     a Machine or TransitionAck answer is encoded by hand
//     (machinewire.go), without the proto codec's reflection over its
//     maps; any other message, or a List an interceptor rebuilt, goes
//     through the proto codec; and
//   - a request whose string fields are not valid UTF-8 still decodes, so
//     that the service answers InvalidArgument with a reason instead of
//     gRPC answering Internal before the handler runs. Every string field
//     of every request is then checked by the handler (desired).
func (s *Service) Codec() encoding.CodecV2 {
	return codec{CodecV2: encoding.GetCodecV2("proto"), answers: s.answers}
}

type codec struct {
	encoding.CodecV2
	answers *answers
}

// Marshal sends a List answer's encoding, counted until gRPC frees it,
// and encodes a Machine or TransitionAck by hand; everything else (a List
// an interceptor changed included) goes through the proto codec.
func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	if l, ok := v.(*pb.MachineList); ok && c.answers != nil {
		if h := c.answers.take(l); h != nil {
			return mem.BufferSlice{c.answers.buffer(h)}, nil
		}
	}
	switch m := v.(type) {
	case *pb.Machine:
		if handEncodable(m) {
			return mem.BufferSlice{mem.SliceBuffer(marshalMachine(m))}, nil
		}
	case *pb.TransitionAck:
		if handEncodableAck(m) {
			return mem.BufferSlice{mem.SliceBuffer(marshalAck(m))}, nil
		}
	}
	return c.CodecV2.Marshal(v)
}

// Unmarshal decodes strictly and, if that fails, once more without UTF-8
// validation (see Codec).
func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.CodecV2.Unmarshal(data, v)
	if err == nil {
		return nil
	}
	m, ok := v.(proto.Message)
	if !ok {
		return err
	}
	if lerr := decodeLenient(data.Materialize(), m); lerr != nil {
		return err
	}
	return nil
}

// lenient is the contract's file descriptor rewritten as an edition-2023
// file with UTF-8 validation off: the same messages, fields, numbers,
// types and presence, decoded without rejecting invalid UTF-8.
var lenient = sync.OnceValues(func() (protoreflect.FileDescriptor, error) {
	fdp := protodesc.ToFileDescriptorProto(pb.File_bigfleet_v1alpha1_provider_proto)
	fdp.Name = proto.String("bigfleet/v1alpha1/provider_lenient.proto")
	fdp.Syntax = proto.String("editions")
	fdp.Edition = descriptorpb.Edition_EDITION_2023.Enum()
	if fdp.Options == nil {
		fdp.Options = &descriptorpb.FileOptions{}
	}
	fdp.Options.Features = &descriptorpb.FeatureSet{
		FieldPresence:  descriptorpb.FeatureSet_IMPLICIT.Enum(),
		Utf8Validation: descriptorpb.FeatureSet_NONE.Enum(),
	}
	return protodesc.NewFile(fdp, protoregistry.GlobalFiles)
})

// decodeLenient decodes b into m through the lenient descriptor and copies
// the fields over by number.
func decodeLenient(b []byte, m proto.Message) error {
	fd, err := lenient()
	if err != nil {
		return err
	}
	dst := m.ProtoReflect()
	md := fd.Messages().ByName(dst.Descriptor().Name())
	if md == nil {
		return fmt.Errorf("no lenient descriptor for %s", dst.Descriptor().FullName())
	}
	src := dynamicpb.NewMessage(md)
	if err := unmarshalDynamic(b, src); err != nil {
		return err
	}
	proto.Reset(m)
	return copyFields(src, dst)
}

// unmarshalDynamic is proto.Unmarshal into a dynamic message, whose slow
// path panics on some malformed input: protobuf-go v1.36.12 decodes a map
// entry whose key comes twice, the second time with the wrong wire type,
// into an invalid key and panics in MapKey (FuzzDecodeRequest found it).
// gRPC decodes a request before any interceptor runs, so the panic would
// end the process; malformed bytes are an error like any other.
func unmarshalDynamic(b []byte, m proto.Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("malformed message: %v", r)
		}
	}()
	return proto.Unmarshal(b, m)
}

// copyFields copies every populated field of src into dst, matching
// fields by number; the two descriptors describe the same message.
func copyFields(src, dst protoreflect.Message) error {
	var err error
	src.Range(func(sf protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		df := dst.Descriptor().Fields().ByNumber(sf.Number())
		if df == nil {
			err = fmt.Errorf("field %d of %s has no counterpart", sf.Number(), dst.Descriptor().FullName())
			return false
		}
		switch {
		case sf.IsMap():
			dm := dst.Mutable(df).Map()
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				if df.MapValue().Message() != nil {
					nv := dm.NewValue()
					if err = copyFields(mv.Message(), nv.Message()); err != nil {
						return false
					}
					mv = nv
				}
				dm.Set(k, mv)
				return true
			})
		case sf.IsList():
			dl := dst.Mutable(df).List()
			sl := v.List()
			for i := 0; i < sl.Len(); i++ {
				ev := sl.Get(i)
				if df.Message() != nil {
					nv := dl.NewElement()
					if err = copyFields(ev.Message(), nv.Message()); err != nil {
						return false
					}
					ev = nv
				}
				dl.Append(ev)
			}
		case sf.Message() != nil:
			nv := dst.Mutable(df)
			err = copyFields(v.Message(), nv.Message())
		default:
			dst.Set(df, v)
		}
		return err == nil
	})
	if err != nil {
		return err
	}
	if u := src.GetUnknown(); len(u) > 0 {
		dst.SetUnknown(u)
	}
	return nil
}
