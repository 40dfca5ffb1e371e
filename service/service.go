// Package service serves the bigfleet.v1alpha1.CapacityProvider gRPC API on
// top of the desired document. Handlers validate, fence, resolve
// idempotency and record intent through desired.Document.Mutate; they never
// call a hypervisor and never wait for one.
//
// Error codes (documented for the shard): InvalidArgument for malformed
// requests and caps, FailedPrecondition only for fencing, NotFound for an
// unknown id, Aborted for a mutation out of position, a conflicting retry
// or a mutation on a FAILED machine, Unimplemented for Delete on a
// bare_metal pool, Unavailable when the state store cannot commit.
package service

import (
	"context"
	"math"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/desired"
)

// Service implements pb.CapacityProviderServer.
type Service struct {
	pb.UnimplementedCapacityProviderServer
	doc      *desired.Document
	provider string
}

// New returns the service. provider is the label stamped on HostRef.
func New(doc *desired.Document, provider string) *Service {
	return &Service{doc: doc, provider: provider}
}

func (s *Service) mutate(ctx context.Context, r desired.Request) (*pb.TransitionAck, error) {
	ack, err := s.doc.Mutate(ctx, r)
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.TransitionAck{OperationId: ack.OpID, Machine: s.machine(ack.Machine)}, nil
}

// Create starts SPECULATIVE → CREATING → IDLE.
func (s *Service) Create(ctx context.Context, r *pb.CreateRequest) (*pb.TransitionAck, error) {
	return s.mutate(ctx, desired.Request{Kind: desired.KindCreate, MachineID: r.GetMachineId(),
		Token: desired.Token{Shard: r.GetShardId(), Epoch: r.GetShardEpoch(), Seq: r.GetSequenceNumber()}})
}

// Configure starts IDLE → CONFIGURING → CONFIGURED.
func (s *Service) Configure(ctx context.Context, r *pb.ConfigureRequest) (*pb.TransitionAck, error) {
	return s.mutate(ctx, desired.Request{Kind: desired.KindConfigure, MachineID: r.GetMachineId(),
		Token:   desired.Token{Shard: r.GetShardId(), Epoch: r.GetShardEpoch(), Seq: r.GetSequenceNumber()},
		Cluster: r.GetClusterId(), Blob: r.GetBootstrapBlob(), Metadata: r.GetShardMetadata()})
}

// Drain starts CONFIGURED → DRAINING → IDLE.
func (s *Service) Drain(ctx context.Context, r *pb.DrainRequest) (*pb.TransitionAck, error) {
	return s.mutate(ctx, desired.Request{Kind: desired.KindDrain, MachineID: r.GetMachineId(),
		Token: desired.Token{Shard: r.GetShardId(), Epoch: r.GetShardEpoch(), Seq: r.GetSequenceNumber()},
		Grace: r.GetGracePeriodSeconds()})
}

// Delete starts IDLE → DELETING → SPECULATIVE.
func (s *Service) Delete(ctx context.Context, r *pb.DeleteRequest) (*pb.TransitionAck, error) {
	return s.mutate(ctx, desired.Request{Kind: desired.KindDelete, MachineID: r.GetMachineId(),
		Token: desired.Token{Shard: r.GetShardId(), Epoch: r.GetShardEpoch(), Seq: r.GetSequenceNumber()}})
}

// Get returns one machine from memory.
func (s *Service) Get(_ context.Context, r *pb.MachineRef) (*pb.Machine, error) {
	if r.GetId() == "" {
		return nil, status.Error(codes.InvalidArgument, "id is empty")
	}
	m := s.doc.Get(r.GetId())
	if m == nil {
		return nil, status.Errorf(codes.NotFound, "machine %s not found", r.GetId())
	}
	return s.machine(m), nil
}

// List returns machines in revision order; see desired.Document.List for
// the cursor semantics. A cursor it cannot read is treated as none.
func (s *Service) List(_ context.Context, f *pb.ListFilter) (*pb.MachineList, error) {
	var states map[desired.State]bool
	if len(f.GetStates()) > 0 {
		states = make(map[desired.State]bool, len(f.GetStates()))
		for _, st := range f.GetStates() {
			states[desired.State(st)] = true
		}
	}
	since, ok := uint64(0), false
	if c := f.GetSinceRevision(); len(c) > 0 {
		since, ok = s.doc.ParseCursor(c)
	}
	max := int(f.GetMaxResults())
	if max < 0 {
		max = 0
	}
	ms, rev := s.doc.List(states, max, since, ok)
	// The answer goes out as one pre-framed run of bytes: each machine's
	// encoding was framed as a MachineList.machines entry when it was
	// built, so the answer is one allocation and a copy per machine, and
	// the server codec sends those bytes as they are (see Codec).
	cursor := s.doc.Cursor(rev)
	n := 0
	for _, m := range ms {
		n += len(s.wire(m).framed)
	}
	raw := make([]byte, 0, n+len(cursor)+8)
	for _, m := range ms {
		raw = append(raw, s.wire(m).framed...)
	}
	raw = protowire.AppendTag(raw, revisionField, protowire.BytesType)
	raw = protowire.AppendBytes(raw, cursor)
	out := &pb.MachineList{}
	out.ProtoReflect().SetUnknown(raw)
	return out, nil
}

// wireMachine is the encoded form of one immutable machine value, built
// once per value. Messages built from it carry their fields as pre-encoded
// raw bytes (protobuf "unknown" fields, which marshal as a plain copy and
// which the client decodes as the real fields), so answering a
// 100,000-machine List costs memory copies rather than re-encoding every
// machine. Such messages are for the wire only: their Go fields are empty.
type wireMachine struct {
	msg    *pb.Machine // for Get and TransitionAck
	framed []byte      // a complete MachineList.machines entry
}

func (s *Service) wire(m *desired.Machine) *wireMachine {
	return m.Memo(s.encode).(*wireMachine)
}

func (s *Service) machine(m *desired.Machine) *pb.Machine { return s.wire(m).msg }

func (s *Service) encode(m *desired.Machine) any {
	raw, err := proto.MarshalOptions{Deterministic: true}.Marshal(s.build(m))
	if err != nil {
		panic("encode machine " + m.ID + ": " + err.Error()) // plain data: cannot fail
	}
	msg := &pb.Machine{}
	msg.ProtoReflect().SetUnknown(raw)
	framed := protowire.AppendTag(nil, machinesField, protowire.BytesType)
	framed = protowire.AppendBytes(framed, raw)
	return &wireMachine{msg: msg, framed: framed}
}

// Field numbers of MachineList.
const (
	machinesField = 1
	revisionField = 2
)

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
		Resources:               &pb.Resources{Resources: resources(m)},
		Labels:                  m.Labels,
		LastError:               m.LastError,
		Allocatable:             &pb.Resources{Resources: m.Allocatable()},
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
	case desired.Failed:
		pm.ShardMetadata = m.ShardMetadata
	}
	return pm
}

// resources is the per-replica shape; a slot without one serves the whole
// instance type, so the map is never empty.
func resources(m *desired.Machine) map[string]string {
	if len(m.Resources) > 0 {
		return m.Resources
	}
	return m.Allocatable()
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
	}[de.Code]
	if code == codes.OK {
		code = codes.Internal
	}
	return status.Error(code, de.Msg)
}
