package bigfleetv1alpha1_test

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/reflect/protoreflect"

	bigfleetv1alpha1 "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
)

// The tables below are the published wire schema (wire-schema.md), written
// out by hand. They are compared against the descriptors compiled into the
// generated code, so any drift in the .proto (a renumbered, renamed, retyped,
// added or removed field, a dropped reservation) fails here.

const protoPackage = "bigfleet.v1alpha1"

// field is one row of a message table. Type is spelled as in the schema:
// a scalar kind, a message or enum name (short if in protoPackage),
// "repeated T" or "map<K,V>".
type field struct {
	Number int
	Name   string
	Type   string
}

// message is the wire shape of one message. ReservedRanges are inclusive
// [first, last] pairs in canonical form: sorted, with adjacent and
// overlapping ranges merged, so `reserved 2, 3;` and `reserved 2 to 3;` are
// both {2, 3}.
type message struct {
	Fields         []field
	ReservedRanges [][2]int
	ReservedNames  []string
}

var wantMessages = map[string]message{
	"HostRef": {Fields: []field{
		{1, "provider", "string"},
		{2, "ref", "string"},
	}},
	"Resources": {Fields: []field{
		{1, "resources", "map<string,string>"},
	}},
	"Machine": {
		Fields: []field{
			{1, "id", "string"},
			{2, "state", "MachineState"},
			{3, "host", "HostRef"},
			{4, "instance_type", "string"},
			{5, "zone", "string"},
			{6, "capacity_type", "CapacityType"},
			{7, "price_per_hour", "double"},
			{8, "interruption_probability", "double"},
			{9, "resources", "Resources"},
			{10, "labels", "map<string,string>"},
			{12, "last_error", "string"},
			{13, "allocatable", "Resources"},
			{14, "cluster", "string"},
			{15, "shard_metadata", "map<string,string>"},
		},
		ReservedRanges: [][2]int{{11, 11}},
		ReservedNames:  []string{"transition_started_unix_nanos"},
	},
	"MachineRef": {Fields: []field{
		{1, "id", "string"},
	}},
	"MachineList": {Fields: []field{
		{1, "machines", "repeated Machine"},
		{2, "revision", "bytes"},
	}},
	"ListFilter": {
		Fields: []field{
			{1, "states", "repeated MachineState"},
			{4, "max_results", "int32"},
			{5, "since_revision", "bytes"},
		},
		ReservedRanges: [][2]int{{2, 3}},
		ReservedNames:  []string{"zone", "instance_type"},
	},
	"CreateRequest": {
		Fields: []field{
			{1, "machine_id", "string"},
			{3, "shard_id", "string"},
			{4, "shard_epoch", "int64"},
			{5, "sequence_number", "int64"},
		},
		ReservedRanges: [][2]int{{2, 2}},
		ReservedNames:  []string{"labels"},
	},
	"ConfigureRequest": {Fields: []field{
		{1, "machine_id", "string"},
		{2, "cluster_id", "string"},
		{3, "bootstrap_blob", "bytes"},
		{4, "shard_id", "string"},
		{5, "shard_epoch", "int64"},
		{6, "sequence_number", "int64"},
		{7, "shard_metadata", "map<string,string>"},
	}},
	"DrainRequest": {Fields: []field{
		{1, "machine_id", "string"},
		{2, "grace_period_seconds", "int64"},
		{3, "shard_id", "string"},
		{4, "shard_epoch", "int64"},
		{5, "sequence_number", "int64"},
	}},
	"DeleteRequest": {Fields: []field{
		{1, "machine_id", "string"},
		{2, "shard_id", "string"},
		{3, "shard_epoch", "int64"},
		{4, "sequence_number", "int64"},
	}},
	"TransitionAck": {Fields: []field{
		{1, "operation_id", "string"},
		{2, "machine", "Machine"},
	}},
}

// enumValue is one value of an enum: its full spelled name and number.
type enumValue struct {
	Name   string
	Number int
}

var wantEnums = map[string][]enumValue{
	"MachineState": {
		{"MACHINE_STATE_UNSPECIFIED", 0},
		{"MACHINE_STATE_SPECULATIVE", 1},
		{"MACHINE_STATE_CREATING", 2},
		{"MACHINE_STATE_IDLE", 3},
		{"MACHINE_STATE_CONFIGURING", 4},
		{"MACHINE_STATE_CONFIGURED", 5},
		{"MACHINE_STATE_DRAINING", 6},
		{"MACHINE_STATE_DELETING", 7},
		{"MACHINE_STATE_FAILED", 8},
	},
	"CapacityType": {
		{"CAPACITY_TYPE_UNSPECIFIED", 0},
		{"CAPACITY_TYPE_BARE_METAL", 1},
		{"CAPACITY_TYPE_RESERVED", 2},
		{"CAPACITY_TYPE_ON_DEMAND", 3},
		{"CAPACITY_TYPE_SPOT", 4},
	},
}

// rpc is one method of the service: request and response message names and
// whether either side streams.
type rpc struct {
	Name            string
	Request         string
	Response        string
	ClientStreaming bool
	ServerStreaming bool
}

var wantService = []rpc{
	{Name: "Create", Request: "CreateRequest", Response: "TransitionAck"},
	{Name: "Configure", Request: "ConfigureRequest", Response: "TransitionAck"},
	{Name: "Drain", Request: "DrainRequest", Response: "TransitionAck"},
	{Name: "Delete", Request: "DeleteRequest", Response: "TransitionAck"},
	{Name: "Get", Request: "MachineRef", Response: "Machine"},
	{Name: "List", Request: "ListFilter", Response: "MachineList"},
}

func file() protoreflect.FileDescriptor {
	return bigfleetv1alpha1.File_bigfleet_v1alpha1_provider_proto
}

func TestFile(t *testing.T) {
	fd := file()
	if got := string(fd.Package()); got != protoPackage {
		t.Errorf("package = %q, want %q", got, protoPackage)
	}
	if got := fd.Syntax(); got != protoreflect.Proto3 {
		t.Errorf("syntax = %v, want proto3", got)
	}

	// Exactly the schema's messages, enums and services; nothing extra.
	var msgs, enums, svcs []string
	for i := 0; i < fd.Messages().Len(); i++ {
		msgs = append(msgs, string(fd.Messages().Get(i).Name()))
	}
	for i := 0; i < fd.Enums().Len(); i++ {
		enums = append(enums, string(fd.Enums().Get(i).Name()))
	}
	for i := 0; i < fd.Services().Len(); i++ {
		svcs = append(svcs, string(fd.Services().Get(i).Name()))
	}
	sortStrings := cmp.Transformer("sort", func(in []string) []string {
		return slices.Sorted(slices.Values(in))
	})
	if diff := cmp.Diff(keys(wantMessages), msgs, sortStrings); diff != "" {
		t.Errorf("top-level messages (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(keys(wantEnums), enums, sortStrings); diff != "" {
		t.Errorf("top-level enums (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"CapacityProvider"}, svcs); diff != "" {
		t.Errorf("services (-want +got):\n%s", diff)
	}
}

func TestMessages(t *testing.T) {
	for name, want := range wantMessages {
		t.Run(name, func(t *testing.T) {
			md := file().Messages().ByName(protoreflect.Name(name))
			if md == nil {
				t.Fatalf("message %s.%s not found", protoPackage, name)
			}
			if diff := cmp.Diff(want, describeMessage(md)); diff != "" {
				t.Errorf("%s wire shape (-want +got):\n%s", md.FullName(), diff)
			}
		})
	}
}

func TestEnums(t *testing.T) {
	for name, want := range wantEnums {
		t.Run(name, func(t *testing.T) {
			ed := file().Enums().ByName(protoreflect.Name(name))
			if ed == nil {
				t.Fatalf("enum %s.%s not found", protoPackage, name)
			}
			var got []enumValue
			for i := 0; i < ed.Values().Len(); i++ {
				v := ed.Values().Get(i)
				got = append(got, enumValue{Name: string(v.Name()), Number: int(v.Number())})
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("%s values (-want +got):\n%s", ed.FullName(), diff)
			}
			if n := ed.ReservedNames().Len() + ed.ReservedRanges().Len(); n != 0 {
				t.Errorf("%s has %d reservations, want none", ed.FullName(), n)
			}
		})
	}
}

func TestService(t *testing.T) {
	sd := file().Services().ByName("CapacityProvider")
	if sd == nil {
		t.Fatalf("service %s.CapacityProvider not found", protoPackage)
	}
	var got []rpc
	for i := 0; i < sd.Methods().Len(); i++ {
		m := sd.Methods().Get(i)
		got = append(got, rpc{
			Name:            string(m.Name()),
			Request:         typeName(m.Input().FullName()),
			Response:        typeName(m.Output().FullName()),
			ClientStreaming: m.IsStreamingClient(),
			ServerStreaming: m.IsStreamingServer(),
		})
	}
	if diff := cmp.Diff(wantService, got); diff != "" {
		t.Errorf("%s methods (-want +got):\n%s", sd.FullName(), diff)
	}
	// The generated gRPC code must name the same service.
	if got, want := bigfleetv1alpha1.CapacityProvider_ServiceDesc.ServiceName, string(sd.FullName()); got != want {
		t.Errorf("CapacityProvider_ServiceDesc.ServiceName = %q, want %q", got, want)
	}
}

// describeMessage reads a message's wire shape back from its descriptor, in
// the same form as the tables above.
func describeMessage(md protoreflect.MessageDescriptor) message {
	var m message
	for i := 0; i < md.Fields().Len(); i++ {
		fd := md.Fields().Get(i)
		m.Fields = append(m.Fields, field{
			Number: int(fd.Number()),
			Name:   string(fd.Name()),
			Type:   fieldType(fd),
		})
	}
	m.ReservedRanges = reservedRanges(md.ReservedRanges())
	for i := 0; i < md.ReservedNames().Len(); i++ {
		m.ReservedNames = append(m.ReservedNames, string(md.ReservedNames().Get(i)))
	}
	if n := md.Oneofs().Len(); n != 0 {
		// Proto3 optional fields live in synthetic oneofs; fieldType
		// reports those. Any other oneof is not in the schema.
		for i := 0; i < n; i++ {
			if od := md.Oneofs().Get(i); !od.IsSynthetic() {
				m.Fields = append(m.Fields, field{Name: "oneof " + string(od.Name())})
			}
		}
	}
	if n := md.Messages().Len(); n != 0 {
		// Map entries are nested messages; anything else is not in the
		// schema.
		for i := 0; i < n; i++ {
			if nd := md.Messages().Get(i); !nd.IsMapEntry() {
				m.Fields = append(m.Fields, field{Name: "nested message " + string(nd.Name())})
			}
		}
	}
	return m
}

// reservedRanges returns rs as sorted, merged, inclusive ranges.
func reservedRanges(rs protoreflect.FieldRanges) [][2]int {
	var in [][2]int
	for i := 0; i < rs.Len(); i++ {
		r := rs.Get(i) // [start, end)
		in = append(in, [2]int{int(r[0]), int(r[1]) - 1})
	}
	slices.SortFunc(in, func(a, b [2]int) int { return a[0] - b[0] })
	var out [][2]int
	for _, r := range in {
		if n := len(out); n > 0 && r[0] <= out[n-1][1]+1 {
			out[n-1][1] = max(out[n-1][1], r[1])
			continue
		}
		out = append(out, r)
	}
	return out
}

// fieldType spells a field's type as the schema does.
func fieldType(fd protoreflect.FieldDescriptor) string {
	switch {
	case fd.IsMap():
		return fmt.Sprintf("map<%s,%s>", singularType(fd.MapKey()), singularType(fd.MapValue()))
	case fd.IsList():
		return "repeated " + singularType(fd)
	case fd.HasOptionalKeyword():
		return "optional " + singularType(fd)
	default:
		return singularType(fd)
	}
}

func singularType(fd protoreflect.FieldDescriptor) string {
	switch fd.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return typeName(fd.Message().FullName())
	case protoreflect.EnumKind:
		return typeName(fd.Enum().FullName())
	default:
		return fd.Kind().String()
	}
}

// typeName drops protoPackage from a full name; a type from any other
// package keeps its full name, so a move shows up as a diff.
func typeName(full protoreflect.FullName) string {
	return strings.TrimPrefix(string(full), protoPackage+".")
}

func keys[V any](m map[string]V) []string {
	return slices.Collect(maps.Keys(m))
}
