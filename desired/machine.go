package desired

import (
	"strings"
	"sync"
	"time"

	"github.com/bigfleet-vm/provider/inventory"
)

// State is a machine's lifecycle state. The numbers equal the wire enum
// bigfleet.v1alpha1.MachineState so conversion is a cast.
type State int32

const (
	Speculative State = 1
	Creating    State = 2
	Idle        State = 3
	Configuring State = 4
	Configured  State = 5
	Draining    State = 6
	Deleting    State = 7
	Failed      State = 8
)

var stateNames = map[State]string{
	Speculative: "SPECULATIVE", Creating: "CREATING", Idle: "IDLE",
	Configuring: "CONFIGURING", Configured: "CONFIGURED", Draining: "DRAINING",
	Deleting: "DELETING", Failed: "FAILED",
}

func (s State) String() string {
	if n, ok := stateNames[s]; ok {
		return n
	}
	return "UNSPECIFIED"
}

// ParseState is the inverse of State.String.
func ParseState(s string) (State, bool) {
	for k, v := range stateNames {
		if v == s {
			return k, true
		}
	}
	return 0, false
}

// Transitional reports whether s is a state a transition runs in.
func (s State) Transitional() bool {
	return s == Creating || s == Configuring || s == Draining || s == Deleting
}

// Kind is a mutation kind.
type Kind string

const (
	KindCreate    Kind = "create"
	KindConfigure Kind = "configure"
	KindDrain     Kind = "drain"
	KindDelete    Kind = "delete"
)

// Capacity types as spelled in offerings and the state file.
const (
	OnDemand  = "on_demand"
	BareMetal = "bare_metal"
)

// Intent is the transition a machine is in. It is durable except for the
// bootstrap blob, which lives only in memory.
type Intent struct {
	Kind     Kind      `json:"kind"`
	OpID     string    `json:"op_id"`
	Started  time.Time `json:"started"`
	Deadline time.Time `json:"deadline"`
	// GraceSeconds is the Drain grace period (at most MaxGraceSeconds).
	GraceSeconds int64 `json:"grace_seconds,omitempty"`
	// Execs lists the plan steps whose guest command has been started for
	// this transition; a re-driven transition never starts them again.
	Execs []string `json:"execs,omitempty"`
}

// ExecStarted reports whether the guest command of step has been started
// for this transition.
func (in *Intent) ExecStarted(step string) bool {
	for _, s := range in.Execs {
		if s == step {
			return true
		}
	}
	return false
}

// OpRecord remembers the operation id accepted for a kind in the current
// cycle and a fingerprint of its payload, so a retry is recognised and a
// conflicting retry is rejected.
type OpRecord struct {
	ID          string `json:"id"`
	Fingerprint string `json:"fp,omitempty"`
}

// Machine is one slot and whatever VM backs it. Values are immutable once
// published: every change makes a copy, so a *Machine handed to a reader
// never changes underneath it.
type Machine struct {
	ID           string `json:"id"`
	Zone         string `json:"zone"`
	InstanceType string `json:"instance_type"`
	Capacity     string `json:"capacity"`
	VCPU         int    `json:"vcpu"`
	MemoryMiB    int    `json:"memory_mib"`
	// Source is the instance type's source of a clone, opaque to the
	// core (inventory.InstanceType.Source). Its key keeps the name it had
	// when only Proxmox used it.
	Source    int               `json:"template_vmid,omitempty"`
	Price     float64           `json:"price"`
	Resources map[string]string `json:"resources,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	// Slotless marks a machine whose offering slot is gone; it stays
	// visible while a VM backs it and disappears once deleted.
	Slotless bool `json:"slotless,omitempty"`

	State State `json:"state"`
	// Since is when the machine entered State.
	Since time.Time `json:"since"`
	// Host is the host ref ("<zone>/<domain>" or "<node>/<vmid>"), set
	// while a VM backs the machine.
	Host string `json:"host,omitempty"`
	// Cycle counts Creates; VMName is derived from it at Create time.
	Cycle         int               `json:"cycle,omitempty"`
	VMName        string            `json:"vm_name,omitempty"`
	VMID          int               `json:"vmid,omitempty"`
	Cluster       string            `json:"cluster,omitempty"`
	ShardMetadata map[string]string `json:"shard_metadata,omitempty"`
	LastError     string            `json:"last_error,omitempty"`
	Intent        *Intent           `json:"intent,omitempty"`
	Ops           map[Kind]OpRecord `json:"ops,omitempty"`
	Rev           uint64            `json:"rev"`

	// In-memory only. blob is nil when no blob is held; an empty blob is
	// a valid, empty file for the hook.
	blob *[]byte
	memo *memo
}

type memo struct {
	once sync.Once
	v    any
}

// Memo returns build(m), computing it once per immutable machine value.
// The gRPC service uses it to cache the wire encoding of a machine.
func (m *Machine) Memo(build func(*Machine) any) any {
	m.memo.once.Do(func() { m.memo.v = build(m) })
	return m.memo.v
}

// Allocatable is the instance type's hardware as BigFleet expects it.
func (m *Machine) Allocatable() map[string]string {
	return inventory.Allocatable(inventory.InstanceType{VCPU: m.VCPU, MemoryMiB: m.MemoryMiB})
}

// clone returns a mutable copy with a fresh memo.
func (m *Machine) clone() *Machine {
	c := *m
	c.memo = &memo{}
	c.Ops = make(map[Kind]OpRecord, len(m.Ops))
	for k, v := range m.Ops {
		c.Ops[k] = v
	}
	if m.Intent != nil {
		in := *m.Intent
		in.Execs = append([]string(nil), m.Intent.Execs...)
		c.Intent = &in
	}
	return &c
}

// fail turns a mutable copy into a FAILED machine: the transition ends,
// the blob is dropped, and the binding (cluster and shard_metadata) is
// cleared, since no cluster holds a failed machine.
func (m *Machine) fail(now time.Time, reason string) {
	m.State, m.Since, m.Intent, m.blob = Failed, now, nil, nil
	m.Cluster, m.ShardMetadata = "", nil
	if strings.TrimSpace(reason) == "" {
		reason = "failed"
	}
	m.LastError = clipText(reason, maxLastErrorBytes)
}
