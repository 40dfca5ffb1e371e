package service

import (
	"fmt"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
)

// Codec returns the server codec: gRPC's proto codec, except that
//   - a List answer's pre-encoded bytes are sent as they are, and
//   - a ConfigureRequest whose strings are not valid UTF-8 is still decoded
//     (Go strings hold any bytes): gRPC would otherwise answer Internal
//     before the handler runs; this way the service answers
//     InvalidArgument with a reason.
func Codec() encoding.CodecV2 {
	return codec{encoding.GetCodecV2("proto")}
}

type codec struct{ encoding.CodecV2 }

// Marshal sends a List answer's pre-encoded bytes without copying them
// again; everything else goes through the proto codec.
func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	if l, ok := v.(*pb.MachineList); ok && len(l.Machines) == 0 && len(l.Revision) == 0 {
		if raw := l.ProtoReflect().GetUnknown(); len(raw) > 0 {
			return mem.BufferSlice{mem.SliceBuffer(raw)}, nil
		}
	}
	return c.CodecV2.Marshal(v)
}

func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.CodecV2.Unmarshal(data, v)
	if err == nil {
		return nil
	}
	if req, ok := v.(*pb.ConfigureRequest); ok {
		buf := data.Materialize()
		fresh := &pb.ConfigureRequest{}
		if lerr := decodeConfigure(buf, fresh); lerr == nil {
			*req = pb.ConfigureRequest{MachineId: fresh.MachineId, ClusterId: fresh.ClusterId, BootstrapBlob: fresh.BootstrapBlob,
				ShardId: fresh.ShardId, ShardEpoch: fresh.ShardEpoch, SequenceNumber: fresh.SequenceNumber, ShardMetadata: fresh.ShardMetadata}
			return nil
		}
	}
	return err
}

// decodeConfigure decodes a ConfigureRequest without UTF-8 validation.
func decodeConfigure(b []byte, r *pb.ConfigureRequest) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		switch {
		case typ == protowire.BytesType && num >= 1 && num <= 4 || typ == protowire.BytesType && num == 7:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
			switch num {
			case 1:
				r.MachineId = string(v)
			case 2:
				r.ClusterId = string(v)
			case 3:
				r.BootstrapBlob = append([]byte(nil), v...)
			case 4:
				r.ShardId = string(v)
			case 7:
				k, val, err := decodeEntry(v)
				if err != nil {
					return err
				}
				if r.ShardMetadata == nil {
					r.ShardMetadata = map[string]string{}
				}
				r.ShardMetadata[k] = val
			}
		case typ == protowire.VarintType && (num == 5 || num == 6):
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
			if num == 5 {
				r.ShardEpoch = int64(v)
			} else {
				r.SequenceNumber = int64(v)
			}
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
		}
	}
	return nil
}

func decodeEntry(b []byte) (key, value string, err error) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return "", "", protowire.ParseError(n)
		}
		b = b[n:]
		if typ != protowire.BytesType || num > 2 {
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return "", "", protowire.ParseError(n)
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return "", "", protowire.ParseError(n)
		}
		b = b[n:]
		if num == 1 {
			key = string(v)
		} else if num == 2 {
			value = string(v)
		} else {
			return "", "", fmt.Errorf("map entry field %d", num)
		}
	}
	return key, value, nil
}
