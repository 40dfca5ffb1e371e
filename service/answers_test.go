package service

import (
	"context"
	"net"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
)

func onConn(port int) context.Context {
	return peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: port}})
}

// TestListAnswersAreSharedAndBounded (issue 17, item 1): concurrent full
// Lists share one encoding; what gRPC has not freed counts against the
// bound until it is freed or its connection closes; a List that does not
// fit is refused with ResourceExhausted, and a small one still fits.
func TestListAnswersAreSharedAndBounded(t *testing.T) {
	s := fleet(t, 2000)
	codec := s.Codec()
	ctx := onConn(1)

	// 50 concurrent full Lists, none sent yet: one encoding held.
	var wg sync.WaitGroup
	lists := make([]*pb.MachineList, 50)
	for i := range lists {
		wg.Go(func() {
			l, err := s.List(ctx, &pb.ListFilter{})
			if err != nil {
				t.Error(err)
			}
			lists[i] = l
		})
	}
	wg.Wait()
	one := s.ListBytesHeld()
	if one <= 0 {
		t.Fatalf("held %d bytes for 50 queued full Lists", one)
	}
	var bufs []mem.BufferSlice
	for _, l := range lists {
		b, err := codec.Marshal(l)
		if err != nil {
			t.Fatal(err)
		}
		bufs = append(bufs, b)
	}
	if got := s.ListBytesHeld(); got != one {
		t.Errorf("held %d bytes once marshalled, want the one shared encoding (%d)", got, one)
	}

	// The bound: two full answers (MinListBytes aside, lowered here).
	s.answers.mu.Lock()
	s.answers.limit = 2 * one
	s.answers.mu.Unlock()
	other := onConn(2)
	distinct := func(n int32) error {
		_, err := s.List(other, &pb.ListFilter{States: []pb.MachineState{pb.MachineState_MACHINE_STATE_SPECULATIVE}, MaxResults: n})
		return err
	}
	if err := distinct(1500); err != nil {
		t.Fatalf("a distinct List within the bound: %v", err)
	}
	if err := distinct(1400); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a distinct List past the bound: %v, want ResourceExhausted", err)
	}
	if err := distinct(3); err != nil {
		t.Errorf("a small List at the bound: %v", err)
	}

	// gRPC freeing the sent buffers gives the shared encoding back; the
	// other connection closing gives its answer back.
	for _, b := range bufs {
		b.Free()
	}
	if got := s.ListBytesHeld(); got == 0 || got >= 2*one {
		t.Errorf("held %d after the shared answer was sent, want only the other connection's", got)
	}
	s.ConnClosed(onConnAddr(2))
	if got := s.ListBytesHeld(); got != 0 {
		t.Errorf("held %d after every answer was sent or its connection closed", got)
	}
	if err := distinct(1400); err != nil {
		t.Errorf("a distinct List once the bound is free again: %v", err)
	}
}

func onConnAddr(port int) string {
	p, _ := peer.FromContext(onConn(port))
	return p.Addr.String()
}
