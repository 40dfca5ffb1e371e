package service

import (
	"context"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/desired"
)

// deposed serves doc to the first call of each answer and then, as a
// replica whose term ended while it answered, serves it no more.
type deposed struct {
	doc   *desired.Document
	calls atomic.Int32
	then  func() (*desired.Document, error)
}

func (d *deposed) Document() (*desired.Document, error) {
	if d.calls.Add(1) == 1 {
		return d.doc, nil
	}
	return d.then()
}

// An answer read from a document that stopped being the one to serve
// before the answer went out is not sent: the handler answers what the
// source says now (a standby's Unavailable), or Unavailable when another
// document took over.
func TestAnswerOnlyWhileTheDocumentIsServed(t *testing.T) {
	doc := fleet(t, 4).docs.(Fixed).Doc
	other := fleet(t, 4).docs.(Fixed).Doc
	id := doc.All()[0].ID
	calls := map[string]func(s *Service) error{
		"Get":  func(s *Service) error { _, err := s.Get(context.Background(), &pb.MachineRef{Id: id}); return err },
		"List": func(s *Service) error { _, err := s.List(context.Background(), &pb.ListFilter{}); return err },
		// The first Create commits; the check comes after the commit.
		"Create": func(s *Service) error {
			_, err := s.Create(context.Background(), &pb.CreateRequest{MachineId: id})
			return err
		},
	}
	for name, call := range calls {
		for _, then := range []struct {
			what string
			f    func() (*desired.Document, error)
		}{
			{"standby", func() (*desired.Document, error) {
				return nil, &desired.Error{Code: desired.CodeUnavailable, Msg: "this replica is a standby; the leader is x"}
			}},
			{"another term", func() (*desired.Document, error) { return other, nil }},
		} {
			src := &deposed{doc: doc, then: then.f}
			err := call(New(src, "libvirt"))
			if status.Code(err) != codes.Unavailable {
				t.Errorf("%s, %s by the time the answer is ready: %v, want Unavailable", name, then.what, err)
			}
			if src.calls.Load() != 2 {
				t.Errorf("%s asked for the document %d times, want 2 (before and after)", name, src.calls.Load())
			}
		}
	}
	// While the document stays, the answers go out.
	s := New(Fixed{doc}, "libvirt")
	for name, call := range calls {
		if err := call(s); err != nil {
			t.Errorf("%s on a served document: %v", name, err)
		}
	}
}
