package service

import (
	"fmt"
	"runtime"
	"sync"
	"weak"

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

// wireMachine is one machine value's message and its encoding framed as a
// MachineList.machines entry, built once per immutable value.
type wireMachine struct {
	msg    *pb.Machine
	framed []byte
}

// frames hands a List answer's pre-encoded machines from the handler to
// the codec. The handler stashes them under the answer's identity; the
// codec takes them back when it marshals that very answer and checks each
// machine is still the message the bytes were made from. An answer that
// never reaches the codec (an interceptor replaced it) is dropped from the
// stash when it is garbage collected, so the stash holds only answers in
// flight.
type frames struct{ m sync.Map } // weak.Pointer[pb.MachineList] → []*wireMachine

func newFrames() *frames { return &frames{} }

func encodeMachine(msg *pb.Machine) *wireMachine {
	raw, err := proto.MarshalOptions{Deterministic: true}.Marshal(msg)
	if err != nil {
		panic("encode machine " + msg.GetId() + ": " + err.Error()) // plain data: cannot fail
	}
	framed := protowire.AppendTag(make([]byte, 0, len(raw)+6), machinesField, protowire.BytesType)
	return &wireMachine{msg: msg, framed: protowire.AppendBytes(framed, raw)}
}

func (f *frames) stash(l *pb.MachineList, ws []*wireMachine) {
	key := weak.Make(l)
	f.m.Store(key, ws)
	runtime.AddCleanup(l, func(k weak.Pointer[pb.MachineList]) { f.m.Delete(k) }, key)
}

func (f *frames) take(l *pb.MachineList) []*wireMachine {
	v, ok := f.m.LoadAndDelete(weak.Make(l))
	if !ok {
		return nil
	}
	return v.([]*wireMachine)
}

// Codec returns the server codec: gRPC's proto codec, except that
//   - a List answer whose machines are the service's own shared messages
//     is encoded by concatenating their pre-encoded bytes: the same bytes a
//     deterministic proto.Marshal produces, at the cost of a copy per
//     machine rather than an encoding (any other message, or a List an
//     interceptor rebuilt, goes through the proto codec); and
//   - a request whose string fields are not valid UTF-8 still decodes, so
//     that the service answers InvalidArgument with a reason instead of
//     gRPC answering Internal before the handler runs. Every string field
//     of every request is then checked by the handler (desired).
func (s *Service) Codec() encoding.CodecV2 {
	return codec{CodecV2: encoding.GetCodecV2("proto"), frames: s.frames}
}

type codec struct {
	encoding.CodecV2
	frames *frames
}

// Marshal sends a List answer's pre-encoded bytes; everything else goes
// through the proto codec.
func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	if l, ok := v.(*pb.MachineList); ok && c.frames != nil && len(l.ProtoReflect().GetUnknown()) == 0 {
		return mem.BufferSlice{mem.SliceBuffer(c.encodeList(l))}, nil
	}
	return c.CodecV2.Marshal(v)
}

func (c codec) encodeList(l *pb.MachineList) []byte {
	ws := c.frames.take(l)
	var own map[int][]byte // machines that are not the shared messages
	n := len(l.Revision) + 12
	for i, m := range l.Machines {
		if i < len(ws) && ws[i].msg == m {
			n += len(ws[i].framed)
			continue
		}
		if own == nil {
			own = map[int][]byte{}
		}
		own[i] = encodeMachine(m).framed
		n += len(own[i])
	}
	out := make([]byte, 0, n)
	for i := range l.Machines {
		if b, ok := own[i]; ok {
			out = append(out, b...)
		} else {
			out = append(out, ws[i].framed...)
		}
	}
	if len(l.Revision) > 0 {
		out = protowire.AppendTag(out, revisionField, protowire.BytesType)
		out = protowire.AppendBytes(out, l.Revision)
	}
	return out
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
	if err := proto.Unmarshal(b, src); err != nil {
		return err
	}
	proto.Reset(m)
	return copyFields(src, dst)
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
