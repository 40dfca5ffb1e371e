package service

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/desired"
	"github.com/bigfleet-vm/provider/hypervisors"
)

func fleet(b testing.TB, n int) *Service {
	b.Helper()
	slots := make([]desired.Slot, n)
	for i := range slots {
		slots[i] = desired.Slot{ID: fmt.Sprintf("rack%d/kvm.small/%03d", i%2, i), Zone: fmt.Sprintf("rack%d", i%2), InstanceType: "kvm.small",
			Capacity: desired.OnDemand, VCPU: 2, MemoryMiB: 4096, Price: 0.0092,
			Resources: map[string]string{"cpu": "1", "memory": "2Gi"}, Labels: map[string]string{"team": "batch"}}
	}
	d, _, err := desired.Open(context.Background(), desired.Options{Store: desired.NewMemoryStore(nil), DefaultInstallation: "i",
		DeleteSupported: true, Now: time.Now, VMName: hypervisors.VMName}, slots)
	if err != nil {
		b.Fatal(err)
	}
	return New(Fixed{d}, "libvirt")
}

// BenchmarkListFull100k is the server's share of a full List of 100,000
// machines: building the response and encoding it as gRPC would.
func BenchmarkListFull100k(b *testing.B) {
	s := fleet(b, 100000)
	codec := s.Codec()
	s.List(context.Background(), &pb.ListFilter{}) // warm the per-machine cache
	b.ResetTimer()
	var size int
	for i := 0; i < b.N; i++ {
		l, _ := s.List(context.Background(), &pb.ListFilter{})
		buf, err := codec.Marshal(l)
		if err != nil {
			b.Fatal(err)
		}
		size = buf.Len()
		buf.Free()
	}
	b.ReportMetric(float64(size)/1e6, "MB/list")
}

// BenchmarkListDecode100k is the client's own cost of decoding that answer.
func BenchmarkListDecode100k(b *testing.B) {
	s := fleet(b, 100000)
	l, _ := s.List(context.Background(), &pb.ListFilter{})
	raw, _ := proto.Marshal(l)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var out pb.MachineList
		if err := proto.Unmarshal(raw, &out); err != nil {
			b.Fatal(err)
		}
	}
}
