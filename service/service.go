package service

import (
	"context"
	"math"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/desired"
)

// Documents hands the service the document to serve, or the error to
// answer instead (a standby replica: Unavailable, naming the leader).
//
// Every handler asks again once its answer is ready and sends it only if
// the same document is still the one to serve; otherwise it answers what
// the second call says (or Unavailable). So a replica that was paused
// while answering, and lost its leadership meanwhile, never sends what it
// read from a term that ended: Document must refuse from the moment the
// term is over, not from the moment the replica notices.
type Documents interface {
	Document() (*desired.Document, error)
}

// Fixed serves one document for good.
type Fixed struct{ Doc *desired.Document }

// Document returns the document.
func (f Fixed) Document() (*desired.Document, error) { return f.Doc, nil }

// Service implements pb.CapacityProviderServer.
type Service struct {
	pb.UnimplementedCapacityProviderServer
	docs     Documents
	provider string
	answers  *answers
	shapes   sync.Map // [vcpu, memory MiB] → allocatable map
}

// New returns the service. provider is the label stamped on HostRef.
func New(docs Documents, provider string) *Service {
	return &Service{docs: docs, provider: provider, answers: &answers{}}
}

// ListBytesHeld returns the bytes of encoded List answers that gRPC has
// not finished sending (readers that do not read hold them).
func (s *Service) ListBytesHeld() int64 { return s.answers.Held() }

// still checks, once an answer from doc is ready, that doc is still the
// document to serve (see Documents).
func (s *Service) still(doc *desired.Document) error {
	now, err := s.docs.Document()
	if err != nil {
		return toStatus(err)
	}
	if now != doc {
		return status.Error(codes.Unavailable, "the desired state changed hands while this call was answered; retry")
	}
	return nil
}

func (s *Service) mutate(ctx context.Context, r desired.Request) (*pb.TransitionAck, error) {
	doc, err := s.docs.Document()
	if err != nil {
		return nil, toStatus(err)
	}
	ack, err := doc.Mutate(ctx, r)
	if err != nil {
		return nil, toStatus(err)
	}
	// A committed mutation answered Unavailable is retried and gets the
	// same operation id from the next leader.
	if err := s.still(doc); err != nil {
		return nil, err
	}
	return &pb.TransitionAck{OperationId: ack.OpID, Machine: s.machine(ack.Machine)}, nil
}

func token(shard string, epoch, seq int64) desired.Token {
	return desired.Token{Shard: shard, Epoch: epoch, Seq: seq}
}

// Create starts SPECULATIVE → CREATING → IDLE.
func (s *Service) Create(ctx context.Context, r *pb.CreateRequest) (*pb.TransitionAck, error) {
	return s.mutate(ctx, desired.Request{Kind: desired.KindCreate, MachineID: r.GetMachineId(),
		Token: token(r.GetShardId(), r.GetShardEpoch(), r.GetSequenceNumber())})
}

// Configure starts IDLE → CONFIGURING → CONFIGURED.
func (s *Service) Configure(ctx context.Context, r *pb.ConfigureRequest) (*pb.TransitionAck, error) {
	return s.mutate(ctx, desired.Request{Kind: desired.KindConfigure, MachineID: r.GetMachineId(),
		Token:   token(r.GetShardId(), r.GetShardEpoch(), r.GetSequenceNumber()),
		Cluster: r.GetClusterId(), Blob: r.GetBootstrapBlob(), Metadata: r.GetShardMetadata()})
}

// Drain starts CONFIGURED → DRAINING → IDLE.
func (s *Service) Drain(ctx context.Context, r *pb.DrainRequest) (*pb.TransitionAck, error) {
	return s.mutate(ctx, desired.Request{Kind: desired.KindDrain, MachineID: r.GetMachineId(),
		Token: token(r.GetShardId(), r.GetShardEpoch(), r.GetSequenceNumber()), Grace: r.GetGracePeriodSeconds()})
}

// Delete starts IDLE → DELETING → SPECULATIVE.
func (s *Service) Delete(ctx context.Context, r *pb.DeleteRequest) (*pb.TransitionAck, error) {
	return s.mutate(ctx, desired.Request{Kind: desired.KindDelete, MachineID: r.GetMachineId(),
		Token: token(r.GetShardId(), r.GetShardEpoch(), r.GetSequenceNumber())})
}

// Get returns one machine from memory: its committed value, or, while a
// change to it is on its way to the store, the value that change commits
// (desired.Document.GetFresh waits for it, a bounded moment).
func (s *Service) Get(ctx context.Context, r *pb.MachineRef) (*pb.Machine, error) {
	if err := desired.CheckID("id", r.GetId()); err != nil {
		return nil, toStatus(err)
	}
	doc, err := s.docs.Document()
	if err != nil {
		return nil, toStatus(err)
	}
	m := doc.GetFresh(ctx, r.GetId())
	if err := s.still(doc); err != nil {
		return nil, err
	}
	if m == nil {
		return nil, status.Errorf(codes.NotFound, "machine %s not found", desired.Clip(r.GetId(), 64))
	}
	return s.machine(m), nil
}

// List returns machines in revision order; see desired.Document.List for
// the cursor semantics. A cursor it cannot read is treated as none. The
// answer's encoding is counted against the bound of List bytes waiting
// for readers (answers.go); concurrent full Lists at one revision share
// one encoding.
func (s *Service) List(ctx context.Context, f *pb.ListFilter) (*pb.MachineList, error) {
	var states map[desired.State]bool
	if len(f.GetStates()) > 0 {
		states = make(map[desired.State]bool, len(f.GetStates()))
		for _, st := range f.GetStates() {
			states[desired.State(st)] = true
		}
	}
	doc, err := s.docs.Document()
	if err != nil {
		return nil, toStatus(err)
	}
	list := func() ([]*desired.Machine, []byte) {
		return doc.List(states, max(int(f.GetMaxResults()), 0), f.GetSinceRevision())
	}
	var e *encoded
	switch {
	case len(states) == 0 && f.GetMaxResults() <= 0 && len(f.GetSinceRevision()) == 0:
		e, err = s.answers.fullAnswer(ctx, doc, doc.Cursor(), list, s.wire)
	case f.GetMaxResults() <= 0 || f.GetMaxResults() > smallList:
		if err = s.answers.room(); err != nil {
			break
		}
		fallthrough
	default:
		ms, next := list()
		e, err = s.answers.add(doc, ms, next, s.wire)
	}
	if err != nil {
		return nil, err
	}
	if err := s.still(doc); err != nil {
		s.answers.release(e)
		return nil, err
	}
	return s.answers.hand(ctx, e), nil
}

// ConnClosed tells the service that the connection from remote (its
// address, as gRPC's peer reports it) closed: the List answers queued for
// it are given back to the bound, since gRPC does not free what it had
// queued for a connection that died.
func (s *Service) ConnClosed(remote string) { s.answers.connClosed(remote) }

// wire returns the message of a machine value, built once per value,
// and its List entry's encoding, built at the first List that holds it.
func (s *Service) wire(m *desired.Machine) *wireMachine {
	return m.Memo(func(m *desired.Machine) any { return &wireMachine{msg: s.build(m)} }).(*wireMachine)
}

func (s *Service) machine(m *desired.Machine) *pb.Machine { return s.wire(m).msg }

// build converts a machine to its wire message.
func (s *Service) build(m *desired.Machine) *pb.Machine {
	ct := pb.CapacityType_CAPACITY_TYPE_ON_DEMAND
	price := m.Price
	if m.Capacity == desired.BareMetal {
		ct, price = pb.CapacityType_CAPACITY_TYPE_BARE_METAL, 0
	}
	if math.IsNaN(price) || math.IsInf(price, 0) || price < 0 {
		price = 0
	}
	pm := &pb.Machine{
		Id:                      m.ID,
		State:                   pb.MachineState(m.State),
		InstanceType:            m.InstanceType,
		Zone:                    m.Zone,
		CapacityType:            ct,
		PricePerHour:            price,
		InterruptionProbability: 0,
		Resources:               &pb.Resources{Resources: s.resources(m)},
		Labels:                  m.Labels,
		LastError:               m.LastError,
		Allocatable:             &pb.Resources{Resources: s.allocatable(m)},
	}
	switch m.State {
	case desired.Speculative:
	case desired.Creating:
		// The host exists only once the transition settles.
	default:
		if m.Host != "" {
			pm.Host = &pb.HostRef{Provider: s.provider, Ref: m.Host}
		}
	}
	switch m.State {
	case desired.Configuring, desired.Configured, desired.Draining:
		pm.Cluster = m.Cluster
		pm.ShardMetadata = m.ShardMetadata
	}
	return pm
}

// allocatable returns the instance type's hardware map, shared by every
// message of that shape (messages are never modified).
func (s *Service) allocatable(m *desired.Machine) map[string]string {
	key := [2]int{m.VCPU, m.MemoryMiB}
	if v, ok := s.shapes.Load(key); ok {
		return v.(map[string]string)
	}
	v, _ := s.shapes.LoadOrStore(key, m.Allocatable())
	return v.(map[string]string)
}

// resources is the per-replica shape; a slot without one serves the whole
// instance type, so the map is never empty.
func (s *Service) resources(m *desired.Machine) map[string]string {
	if len(m.Resources) > 0 {
		return m.Resources
	}
	return s.allocatable(m)
}

func toStatus(err error) error {
	de, ok := err.(*desired.Error)
	if !ok {
		return status.Error(codes.Internal, err.Error())
	}
	code := map[desired.ErrCode]codes.Code{
		desired.CodeInvalid:       codes.InvalidArgument,
		desired.CodeFenced:        codes.FailedPrecondition,
		desired.CodeNotFound:      codes.NotFound,
		desired.CodeConflict:      codes.Aborted,
		desired.CodeUnimplemented: codes.Unimplemented,
		desired.CodeUnavailable:   codes.Unavailable,
		desired.CodeExhausted:     codes.ResourceExhausted,
	}[de.Code]
	if code == codes.OK {
		code = codes.Internal
	}
	return status.Error(code, de.Msg)
}
