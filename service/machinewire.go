package service

import (
	"math"
	"slices"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
)

// Machines are encoded on every walk step (once per new value for the
// memo, and again in every Get or Create answer), so their encoding is
// written by hand: byte for byte what proto.MarshalOptions{Deterministic:
// true} writes (fields in number order, zero scalars left out, map
// entries sorted by key with key and value always present), which
// TestMachineEncodingMatchesProto holds it to. The generic marshaller
// walks the four string maps by reflection, a copy of every key and value
// each time: most of what a Get answer allocated.
//
// Only messages the hand encoding covers take this path (handEncodable):
// every string valid UTF-8, which proto.Marshal checks, and no unknown
// fields. Anything else goes through proto as before.

// Tags of Machine, TransitionAck, HostRef, Resources and a map entry (all
// fields below 16, so one byte each).
const (
	tagID           = 1<<3 | byte(protowire.BytesType)
	tagState        = 2<<3 | byte(protowire.VarintType)
	tagHost         = 3<<3 | byte(protowire.BytesType)
	tagInstanceType = 4<<3 | byte(protowire.BytesType)
	tagZone         = 5<<3 | byte(protowire.BytesType)
	tagCapacityType = 6<<3 | byte(protowire.VarintType)
	tagPrice        = 7<<3 | byte(protowire.Fixed64Type)
	tagInterruption = 8<<3 | byte(protowire.Fixed64Type)
	tagResources    = 9<<3 | byte(protowire.BytesType)
	tagLabels       = 10<<3 | byte(protowire.BytesType)
	tagLastError    = 12<<3 | byte(protowire.BytesType)
	tagAllocatable  = 13<<3 | byte(protowire.BytesType)
	tagCluster      = 14<<3 | byte(protowire.BytesType)
	tagShardMeta    = 15<<3 | byte(protowire.BytesType)

	tagAckOpID    = 1<<3 | byte(protowire.BytesType)
	tagAckMachine = 2<<3 | byte(protowire.BytesType)

	tagHostProvider = 1<<3 | byte(protowire.BytesType)
	tagHostRef      = 2<<3 | byte(protowire.BytesType)
	tagResMap       = 1<<3 | byte(protowire.BytesType)
	tagEntryKey     = 1<<3 | byte(protowire.BytesType)
	tagEntryValue   = 2<<3 | byte(protowire.BytesType)
)

// handEncodable reports whether m takes the hand encoding: no unknown
// fields anywhere and every string valid UTF-8.
func handEncodable(m *pb.Machine) bool {
	if m == nil || len(m.ProtoReflect().GetUnknown()) > 0 {
		return false
	}
	if !utf8.ValidString(m.Id) || !utf8.ValidString(m.InstanceType) || !utf8.ValidString(m.Zone) ||
		!utf8.ValidString(m.LastError) || !utf8.ValidString(m.Cluster) ||
		!validMap(m.Labels) || !validMap(m.ShardMetadata) {
		return false
	}
	if h := m.Host; h != nil && (len(h.ProtoReflect().GetUnknown()) > 0 || !utf8.ValidString(h.Provider) || !utf8.ValidString(h.Ref)) {
		return false
	}
	for _, r := range [2]*pb.Resources{m.Resources, m.Allocatable} {
		if r != nil && (len(r.ProtoReflect().GetUnknown()) > 0 || !validMap(r.Resources)) {
			return false
		}
	}
	return true
}

func validMap(m map[string]string) bool {
	for k, v := range m {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return false
		}
	}
	return true
}

// sizeString is the size of a non-empty string field (one-byte tag).
func sizeString(s string) int {
	if s == "" {
		return 0
	}
	return 1 + protowire.SizeBytes(len(s))
}

func appendString(b []byte, tag byte, s string) []byte {
	if s == "" {
		return b
	}
	return protowire.AppendString(append(b, tag), s)
}

// sizeEntry is the size of a map entry's body.
func sizeEntry(k, v string) int {
	return 1 + protowire.SizeBytes(len(k)) + 1 + protowire.SizeBytes(len(v))
}

// sizeMap is the size of a map field's entries, tags included.
func sizeMap(m map[string]string) int {
	n := 0
	for k, v := range m {
		n += 1 + protowire.SizeBytes(sizeEntry(k, v))
	}
	return n
}

// appendMap appends m's entries in key order, each under tag. Keys are
// sorted in place on the stack for the maps the service builds (a few
// entries); a larger map sorts a slice of its own.
func appendMap(b []byte, tag byte, m map[string]string) []byte {
	if len(m) == 0 {
		return b
	}
	var small [16]string
	keys := small[:0]
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		v := m[k]
		b = protowire.AppendVarint(append(b, tag), uint64(sizeEntry(k, v)))
		b = protowire.AppendString(append(b, tagEntryKey), k)
		b = protowire.AppendString(append(b, tagEntryValue), v)
	}
	return b
}

func sizeHost(h *pb.HostRef) int { return sizeString(h.Provider) + sizeString(h.Ref) }

func sizeDouble(v float64) int {
	if math.Float64bits(v) == 0 { // proto3 leaves out +0 only
		return 0
	}
	return 9
}

func appendDouble(b []byte, tag byte, v float64) []byte {
	if math.Float64bits(v) == 0 {
		return b
	}
	return protowire.AppendFixed64(append(b, tag), math.Float64bits(v))
}

func sizeEnum(v int32) int {
	if v == 0 {
		return 0
	}
	return 1 + protowire.SizeVarint(uint64(int64(v)))
}

func appendEnum(b []byte, tag byte, v int32) []byte {
	if v == 0 {
		return b
	}
	return protowire.AppendVarint(append(b, tag), uint64(int64(v)))
}

// sizeMessage is the size of a set message field whose body is n bytes.
func sizeMessage(n int) int { return 1 + protowire.SizeBytes(n) }

// sizeMachine is the size of m's encoding (handEncodable(m) must hold).
func sizeMachine(m *pb.Machine) int {
	n := sizeString(m.Id) + sizeEnum(int32(m.State))
	if m.Host != nil {
		n += sizeMessage(sizeHost(m.Host))
	}
	n += sizeString(m.InstanceType) + sizeString(m.Zone) + sizeEnum(int32(m.CapacityType))
	n += sizeDouble(m.PricePerHour) + sizeDouble(m.InterruptionProbability)
	if m.Resources != nil {
		n += sizeMessage(sizeMap(m.Resources.Resources))
	}
	n += sizeMap(m.Labels) + sizeString(m.LastError)
	if m.Allocatable != nil {
		n += sizeMessage(sizeMap(m.Allocatable.Resources))
	}
	return n + sizeString(m.Cluster) + sizeMap(m.ShardMetadata)
}

// appendMachine appends m's encoding (handEncodable(m) must hold).
func appendMachine(b []byte, m *pb.Machine) []byte {
	b = appendString(b, tagID, m.Id)
	b = appendEnum(b, tagState, int32(m.State))
	if h := m.Host; h != nil {
		b = protowire.AppendVarint(append(b, tagHost), uint64(sizeHost(h)))
		b = appendString(b, tagHostProvider, h.Provider)
		b = appendString(b, tagHostRef, h.Ref)
	}
	b = appendString(b, tagInstanceType, m.InstanceType)
	b = appendString(b, tagZone, m.Zone)
	b = appendEnum(b, tagCapacityType, int32(m.CapacityType))
	b = appendDouble(b, tagPrice, m.PricePerHour)
	b = appendDouble(b, tagInterruption, m.InterruptionProbability)
	if r := m.Resources; r != nil {
		b = protowire.AppendVarint(append(b, tagResources), uint64(sizeMap(r.Resources)))
		b = appendMap(b, tagResMap, r.Resources)
	}
	b = appendMap(b, tagLabels, m.Labels)
	b = appendString(b, tagLastError, m.LastError)
	if r := m.Allocatable; r != nil {
		b = protowire.AppendVarint(append(b, tagAllocatable), uint64(sizeMap(r.Resources)))
		b = appendMap(b, tagResMap, r.Resources)
	}
	b = appendString(b, tagCluster, m.Cluster)
	return appendMap(b, tagShardMeta, m.ShardMetadata)
}

// handEncodableAck reports whether a takes the hand encoding.
func handEncodableAck(a *pb.TransitionAck) bool {
	return a != nil && len(a.ProtoReflect().GetUnknown()) == 0 && utf8.ValidString(a.OperationId) &&
		(a.Machine == nil || handEncodable(a.Machine))
}

// marshalAck is a TransitionAck's encoding, in one allocation
// (handEncodableAck(a) must hold).
func marshalAck(a *pb.TransitionAck) []byte {
	n, mn := sizeString(a.OperationId), 0
	if a.Machine != nil {
		mn = sizeMachine(a.Machine)
		n += sizeMessage(mn)
	}
	b := appendString(make([]byte, 0, n), tagAckOpID, a.OperationId)
	if a.Machine != nil {
		b = appendMachine(protowire.AppendVarint(append(b, tagAckMachine), uint64(mn)), a.Machine)
	}
	return b
}

// marshalMachine is a Machine's encoding, in one allocation
// (handEncodable(m) must hold).
func marshalMachine(m *pb.Machine) []byte {
	return appendMachine(make([]byte, 0, sizeMachine(m)), m)
}
