package contract

import (
	"bytes"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protowire"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/internal/providertest"
)

// oddMetadata exercises every kind of byte the contract names.
func oddMetadata() map[string]string {
	md := map[string]string{
		"nul\x00key":       "nul\x00value\x00",
		"ctrl":             "\x01\x02\x07\x08\t\n\r\x1b[31m\x7f",
		"empty":            "",
		"":                 "empty key",
		"unicode-ключ-鍵-🔑": "значение 値 ✓ \u200b\u202e rtl",
		"spaces  ":         "  leading and trailing  ",
		"json":             `{"a":[1,2,{"b":"c"}]}`,
		"long":             strings.Repeat("x", 4000),
	}
	for i := range 48 {
		md[fmt.Sprintf("k%02d", i)] = fmt.Sprintf("v%02d\x00%c", i, rune(0x400+i))
	}
	return md
}

func testShardMetadataVerbatim(t *testing.T, h Harness) {
	s := h.start(t, "--seed-count", "4", "--fake-latency", "100ms")
	id := speculative(t, s.c, 1)[0]
	toIdle(t, s.c, id)
	md := oddMetadata()
	want := maps.Clone(md)
	ack := providertest.Must(t, "configure")(configure(s.c, t, id, "c1", md, tok{}))
	// The stored copy is the provider's own.
	md["ctrl"] = "changed"
	md["added"] = "x"
	if ack.Machine.State != providertest.StConfiguring && ack.Machine.State != providertest.StConfigured {
		t.Fatalf("ack state %v", ack.Machine.State)
	}
	if diff := protoDiff(want, ack.Machine.ShardMetadata); diff != "" {
		t.Errorf("ack shard_metadata (-want +got):\n%s", diff)
	}
	check := func(when string) {
		t.Helper()
		if diff := protoDiff(want, providertest.Get(t, s.c, id).ShardMetadata); diff != "" {
			t.Errorf("%s: Get shard_metadata (-want +got):\n%s", when, diff)
		}
		for _, m := range providertest.ListAll(t, s.c) {
			if m.Id == id {
				if diff := protoDiff(want, m.ShardMetadata); diff != "" {
					t.Errorf("%s: List shard_metadata (-want +got):\n%s", when, diff)
				}
			}
		}
	}
	if providertest.Get(t, s.c, id).State == providertest.StConfiguring {
		check("while CONFIGURING")
	}
	providertest.WaitState(t, s.c, id, providertest.StConfigured, pollDeadline)
	check("CONFIGURED")
	// Idempotent retry with the same map returns the same op.
	if a := providertest.Must(t, "configure retry")(configure(s.c, t, id, "c1", want, tok{})); a.OperationId != ack.OperationId {
		t.Errorf("retry op %q, want %q", a.OperationId, ack.OperationId)
	}
	providertest.Must(t, "drain")(drain(s.c, t, id, tok{}))
	providertest.WaitState(t, s.c, id, providertest.StIdle, pollDeadline)
	if m := providertest.Get(t, s.c, id); len(m.ShardMetadata) != 0 || m.Cluster != "" {
		t.Errorf("after Drain: cluster %q metadata %d keys, want both cleared", m.Cluster, len(m.ShardMetadata))
	}
	next := map[string]string{"only": "this"}
	providertest.Must(t, "configure#2")(configure(s.c, t, id, "c2", next, tok{}))
	if diff := protoDiff(next, providertest.WaitState(t, s.c, id, providertest.StConfigured, pollDeadline).ShardMetadata); diff != "" {
		t.Errorf("second Configure shows old keys (-want +got):\n%s", diff)
	}
}

func testConfigureCaps(t *testing.T, h Harness) {
	const (
		maxEntries = 128
		maxBytes   = 64 << 10
		maxBlob    = 8 << 20
	)
	entries := func(n int) map[string]string {
		md := make(map[string]string, n)
		for i := range n {
			md[fmt.Sprintf("key-%03d", i)] = "v"
		}
		return md
	}
	sized := func(total int) map[string]string {
		// one key "k" plus a value filling the rest
		return map[string]string{"k": strings.Repeat("m", total-1)}
	}
	s := h.start(t, "--seed-count", "16")
	ids := speculative(t, s.c, 7)
	for _, id := range ids {
		toIdle(t, s.c, id)
	}
	tests := []struct {
		name string
		md   map[string]string
		blob []byte
		want codes.Code
	}{
		{"128 entries", entries(maxEntries), nil, codes.OK},
		{"129 entries", entries(maxEntries + 1), nil, codes.InvalidArgument},
		{"64KiB metadata", sized(maxBytes), nil, codes.OK},
		{"64KiB+1 metadata", sized(maxBytes + 1), nil, codes.InvalidArgument},
		{"6MiB blob", nil, bytes.Repeat([]byte("#"), 6<<20), codes.OK},
		{"8MiB blob", nil, bytes.Repeat([]byte("#"), maxBlob), codes.OK},
		{"8MiB+1 blob", nil, bytes.Repeat([]byte("#"), maxBlob+1), codes.InvalidArgument},
	}
	for i, tc := range tests {
		id := ids[i]
		t.Run(tc.name, func(t *testing.T) {
			blob := tc.blob
			if blob == nil {
				blob = []byte("#!/bin/sh\n")
			}
			before := providertest.Get(t, s.c, id)
			a, err := s.c.Configure(ctx(t), &pb.ConfigureRequest{MachineId: id, ClusterId: "c", BootstrapBlob: blob, ShardMetadata: tc.md})
			if got := code(err); got != tc.want {
				t.Fatalf("code %v (%v), want %v", got, err, tc.want)
			}
			if tc.want != codes.OK {
				providertest.Holds(t, s.c, id, providertest.StIdle, 200*time.Millisecond)
				if diff := protoDiff(before, providertest.Get(t, s.c, id)); diff != "" {
					t.Errorf("rejected Configure changed the machine (-before +after):\n%s", diff)
				}
				return
			}
			if diff := protoDiff(tc.md, a.Machine.ShardMetadata); diff != "" && len(tc.md) > 0 {
				t.Errorf("ack metadata not verbatim (-want +got):\n%s", diff)
			}
			m := providertest.WaitState(t, s.c, id, providertest.StConfigured, pollDeadline)
			if diff := protoDiff(tc.md, m.ShardMetadata); diff != "" && len(tc.md) > 0 {
				t.Errorf("stored metadata not verbatim (-want +got):\n%s", diff)
			}
		})
	}
}

// testShardMetadataInvalidUTF8 documents what the server does with bytes
// that are not valid UTF-8 in a map<string,string> (proto3 requires UTF-8;
// the Go runtime rejects it on decode). Either outcome is acceptable by
// the contract as long as it is InvalidArgument-like and nothing changes,
// or the bytes round-trip verbatim.
func testShardMetadataInvalidUTF8(t *testing.T, h Harness) {
	s := h.start(t, "--seed-count", "4")
	id := speculative(t, s.c, 1)[0]
	toIdle(t, s.c, id)
	entry := protowire.AppendTag(nil, 1, protowire.BytesType)
	entry = protowire.AppendString(entry, "bad\xffkey")
	entry = protowire.AppendTag(entry, 2, protowire.BytesType)
	entry = protowire.AppendString(entry, "\xc3\x28 value")
	var req []byte
	req = protowire.AppendTag(req, 1, protowire.BytesType)
	req = protowire.AppendString(req, id)
	req = protowire.AppendTag(req, 2, protowire.BytesType)
	req = protowire.AppendString(req, "c1")
	req = protowire.AppendTag(req, 3, protowire.BytesType)
	req = protowire.AppendBytes(req, []byte("#!/bin/sh\n"))
	req = protowire.AppendTag(req, 7, protowire.BytesType)
	req = protowire.AppendBytes(req, entry)
	var resp []byte
	err := s.Conn().Invoke(ctx(t), "/bigfleet.v1alpha1.CapacityProvider/Configure", &req, &resp, grpc.ForceCodec(providertest.RawCodec{}))
	t.Logf("Configure with invalid UTF-8 in shard_metadata: code %v: %v", code(err), err)
	switch code(err) {
	case codes.OK:
		t.Logf("accepted; reply %d bytes", len(resp))
	case codes.FailedPrecondition:
		t.Errorf("invalid UTF-8 answered FAILED_PRECONDITION")
	default:
		if code(err) != codes.InvalidArgument {
			t.Errorf("invalid UTF-8 rejected with %v, want InvalidArgument (a documented cap-style rejection)", code(err))
		}
		providertest.Holds(t, s.c, id, providertest.StIdle, 200*time.Millisecond)
	}
}
