package desired

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/statefile"
)

// Caps on Configure payloads. Above them the RPC answers InvalidArgument and
// nothing changes; nothing is ever truncated.
const (
	MaxBlobBytes       = 8 << 20 // 8 MiB
	MaxMetadataEntries = 128
	MaxMetadataBytes   = 64 << 10 // keys plus values
	// MaxUnknownFences bounds the fence marks kept for machine ids that do
	// not exist (any client can name arbitrary ids); the oldest go first.
	MaxUnknownFences     = 65536
	formatVersion        = 1
	maxLastErrorBytes    = 2048
	keyMachine           = "m/"
	keyFence             = "f/"
	keyMeta              = "meta/doc"
	defaultDrainMargin   = 2 * time.Minute
	interruptedConfigure = "configure interrupted by a provider restart: the bootstrap blob is never written to disk, so the transition cannot be resumed; retry on another slot"
)

// Store is where the document's changes become durable (statefile.File or
// statefile.Memory; a replicated store could stand in).
type Store interface {
	Snapshot() map[string][]byte
	Apply(ops ...statefile.Op) uint64
	Wait(ctx context.Context, seq uint64) error
	Healthy() error
}

// Slot is one offering slot as the inventory computed it.
type Slot struct {
	ID           string
	Zone         string
	InstanceType string
	Capacity     string
	VCPU         int
	MemoryMiB    int
	TemplateVMID int
	Price        float64
	Resources    map[string]string
	Labels       map[string]string
}

// Options configure a Document.
type Options struct {
	Store Store
	// Installation names this installation in VM names and markers. If the
	// store already records one, a different non-empty value is an error.
	Installation string
	// DefaultInstallation is used when neither the store nor Installation
	// names one (a fresh state).
	DefaultInstallation string
	Timeouts            map[Kind]time.Duration
	// DeleteSupported is false for bare_metal pools (Delete: Unimplemented).
	DeleteSupported bool
	Now             func() time.Time
	// Notify is called (outside the lock) with a machine id whenever its
	// intent changes durably, to wake the reconciler.
	Notify func(id string)
}

// ErrCode classifies a rejected mutation; the gRPC service maps it to a
// status code.
type ErrCode int

const (
	CodeInvalid       ErrCode = iota + 1 // InvalidArgument
	CodeFenced                           // FailedPrecondition (fencing only)
	CodeNotFound                         // NotFound
	CodeConflict                         // Aborted: out of position, conflicting retry, FAILED machine
	CodeUnimplemented                    // Unimplemented (Delete on bare_metal)
	CodeUnavailable                      // Unavailable: the state store failed
)

// Error is a rejected mutation.
type Error struct {
	Code ErrCode
	Msg  string
}

func (e *Error) Error() string { return e.Msg }

func errorf(code ErrCode, format string, a ...any) *Error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, a...)}
}

// Token is a shard's fencing token.
type Token struct {
	Shard string
	Epoch int64
	Seq   int64
}

func (t Token) zero() bool { return t.Shard == "" && t.Epoch == 0 && t.Seq == 0 }

type mark struct {
	Epoch int64 `json:"e"`
	Seq   int64 `json:"s"`
}

// Request is one mutating RPC.
type Request struct {
	Kind      Kind
	MachineID string
	Token     Token
	Cluster   string
	Blob      []byte
	Metadata  map[string]string
	Grace     int64
}

// Ack answers an accepted (or idempotently repeated) mutation.
type Ack struct {
	OpID    string
	Machine *Machine
}

type meta struct {
	Version      int    `json:"version"`
	Lineage      string `json:"lineage"`
	Installation string `json:"installation"`
	NextOp       uint64 `json:"next_op"`
	Rev          uint64 `json:"rev"`
}

// Document is the desired state: every machine, its intent, the fence marks
// and the counters. All methods are safe for concurrent use.
type Document struct {
	opts Options

	mu       sync.RWMutex
	machines map[string]*Machine
	head     *Machine // oldest revision
	tail     *Machine // newest revision
	fences   map[string]mark
	// unknownFences lists, oldest first, the fence keys recorded for
	// machine ids that did not exist.
	unknownFences []string
	meta          meta
	dirty         map[string]bool
}

// LoadReport says what Open changed while reconciling the stored document
// with the offerings and recovering interrupted transitions.
type LoadReport struct {
	Added, Removed, Slotless, Redriven, FailedConfigure int
}

// Open loads the document from the store, reconciles it with the slots and
// recovers transitions interrupted by a restart; all of that is durable
// before Open returns.
func Open(ctx context.Context, opts Options, slots []Slot) (*Document, LoadReport, error) {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	d := &Document{opts: opts, machines: map[string]*Machine{}, fences: map[string]mark{}}
	var rep LoadReport
	snap := opts.Store.Snapshot()
	if raw, ok := snap[keyMeta]; ok {
		if err := json.Unmarshal(raw, &d.meta); err != nil {
			return nil, rep, fmt.Errorf("state: decode document header: %w", err)
		}
		if d.meta.Version != formatVersion {
			return nil, rep, fmt.Errorf("state: document format version %d is not supported (want %d)", d.meta.Version, formatVersion)
		}
	} else {
		d.meta = meta{Version: formatVersion, Lineage: newLineage()}
	}
	switch {
	case d.meta.Installation == "":
		d.meta.Installation = opts.Installation
	case opts.Installation != "" && opts.Installation != d.meta.Installation:
		return nil, rep, fmt.Errorf("state: the state file belongs to installation %q but --installation-id is %q; VMs are named and marked by installation, so changing it would orphan them", d.meta.Installation, opts.Installation)
	}
	if d.meta.Installation == "" {
		d.meta.Installation = opts.DefaultInstallation
	}
	if d.meta.Installation == "" {
		return nil, rep, errors.New("state: no installation id")
	}
	loaded := make([]*Machine, 0, len(snap))
	for k, raw := range snap {
		switch {
		case strings.HasPrefix(k, keyMachine):
			m := &Machine{}
			if err := json.Unmarshal(raw, m); err != nil {
				return nil, rep, fmt.Errorf("state: decode machine %q: %w", strings.TrimPrefix(k, keyMachine), err)
			}
			m.memo = &memo{}
			if m.Ops == nil {
				m.Ops = map[Kind]OpRecord{}
			}
			loaded = append(loaded, m)
			if m.Rev > d.meta.Rev {
				d.meta.Rev = m.Rev
			}
		case strings.HasPrefix(k, keyFence):
			var fm mark
			if err := json.Unmarshal(raw, &fm); err != nil {
				return nil, rep, fmt.Errorf("state: decode fence mark: %w", err)
			}
			d.fences[strings.TrimPrefix(k, keyFence)] = fm
		}
	}
	// Rebuild the revision order.
	sort.Slice(loaded, func(i, j int) bool {
		if loaded[i].Rev != loaded[j].Rev {
			return loaded[i].Rev < loaded[j].Rev
		}
		return loaded[i].ID < loaded[j].ID
	})
	for _, m := range loaded {
		d.machines[m.ID] = m
		d.link(m)
	}
	for key := range d.fences {
		if _, machine, _ := strings.Cut(key, "\x00"); d.machines[machine] == nil {
			d.unknownFences = append(d.unknownFences, key)
		}
	}
	sort.Strings(d.unknownFences)

	now := opts.Now()
	var ops []statefile.Op
	put := func(m *Machine) {
		d.meta.Rev++
		m.Rev = d.meta.Rev
		d.unlink(d.machines[m.ID])
		d.machines[m.ID] = m
		d.link(m)
		ops = append(ops, d.machineOp(m))
	}
	inSlots := make(map[string]bool, len(slots))
	for _, s := range slots {
		inSlots[s.ID] = true
		old := d.machines[s.ID]
		if old == nil {
			put(&Machine{ID: s.ID, Zone: s.Zone, InstanceType: s.InstanceType, Capacity: s.Capacity,
				VCPU: s.VCPU, MemoryMiB: s.MemoryMiB, TemplateVMID: s.TemplateVMID, Price: s.Price,
				Resources: s.Resources, Labels: s.Labels, State: Speculative, Since: now,
				Ops: map[Kind]OpRecord{}, memo: &memo{}})
			rep.Added++
			continue
		}
		if old.Zone != s.Zone || old.InstanceType != s.InstanceType {
			return nil, rep, fmt.Errorf("state: machine %s is recorded as %s in %s but the offerings now say %s in %s; ids are stable per (zone, type), so this state file belongs to other offerings", s.ID, old.InstanceType, old.Zone, s.InstanceType, s.Zone)
		}
		if !slotMatches(old, s) {
			m := old.clone()
			m.Capacity, m.VCPU, m.MemoryMiB, m.TemplateVMID = s.Capacity, s.VCPU, s.MemoryMiB, s.TemplateVMID
			m.Price, m.Resources, m.Labels, m.Slotless = s.Price, s.Resources, s.Labels, false
			put(m)
		}
	}
	for _, old := range loaded {
		if inSlots[old.ID] {
			continue
		}
		if old.State == Speculative {
			d.unlink(old)
			delete(d.machines, old.ID)
			ops = append(ops, statefile.Op{Key: keyMachine + old.ID, Delete: true})
			rep.Removed++
			continue
		}
		if !old.Slotless {
			m := old.clone()
			m.Slotless = true
			put(m)
			rep.Slotless++
		}
	}
	for _, id := range d.sortedIDs() {
		old := d.machines[id]
		if old.Intent == nil {
			continue
		}
		m := old.clone()
		if m.Intent.Kind == KindConfigure {
			m.State, m.Since, m.Intent = Failed, now, nil
			m.LastError = interruptedConfigure
			rep.FailedConfigure++
		} else {
			// Create, Drain and Delete are re-driven from the durable intent
			// with a fresh deadline: the time the provider was down must not
			// count against the hypervisor.
			m.Intent.Deadline = now.Add(d.timeout(m.Intent.Kind, m.Intent.GraceSeconds))
			rep.Redriven++
		}
		put(m)
	}
	ops = append(ops, d.metaOp())
	seq := opts.Store.Apply(ops...)
	if err := opts.Store.Wait(ctx, seq); err != nil {
		return nil, rep, fmt.Errorf("state: commit recovered document: %w", err)
	}
	return d, rep, nil
}

func slotMatches(m *Machine, s Slot) bool {
	return m.Capacity == s.Capacity && m.VCPU == s.VCPU && m.MemoryMiB == s.MemoryMiB &&
		m.TemplateVMID == s.TemplateVMID && m.Price == s.Price && !m.Slotless &&
		mapsEqual(m.Resources, s.Resources) && mapsEqual(m.Labels, s.Labels)
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if bv, ok := b[k]; !ok || bv != v {
			return false
		}
	}
	return true
}

func newLineage() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return hex.EncodeToString(b[:])
}

// Installation returns the installation id recorded in the document.
func (d *Document) Installation() string { return d.meta.Installation }

// Lineage identifies this document's revision space.
func (d *Document) Lineage() string { return d.meta.Lineage }

func (d *Document) timeout(k Kind, grace int64) time.Duration {
	t := d.opts.Timeouts[k]
	if t <= 0 {
		t = 5 * time.Minute
	}
	if k == KindDrain {
		// A drain may take its whole grace period plus a margin.
		if g := time.Duration(grace)*time.Second + defaultDrainMargin; g > t {
			t = g
		}
	}
	return t
}

// --- revision-ordered list ---

func (d *Document) link(m *Machine) {
	m.prev, m.next = d.tail, nil
	if d.tail != nil {
		d.tail.next = m
	} else {
		d.head = m
	}
	d.tail = m
}

func (d *Document) unlink(m *Machine) {
	if m == nil {
		return
	}
	if m.prev != nil {
		m.prev.next = m.next
	} else if d.head == m {
		d.head = m.next
	}
	if m.next != nil {
		m.next.prev = m.prev
	} else if d.tail == m {
		d.tail = m.prev
	}
	m.prev, m.next = nil, nil
}

// publish replaces a machine with its new value at the newest revision and
// queues its record; callers hold mu.
func (d *Document) publish(m *Machine, extra ...statefile.Op) uint64 {
	d.meta.Rev++
	m.Rev = d.meta.Rev
	d.unlink(d.machines[m.ID])
	d.machines[m.ID] = m
	d.link(m)
	ops := append([]statefile.Op{d.machineOp(m)}, extra...)
	seq := d.opts.Store.Apply(ops...)
	m.commitSeq = seq
	return seq
}

func (d *Document) machineOp(m *Machine) statefile.Op {
	raw, err := json.Marshal(m)
	if err != nil {
		panic(fmt.Sprintf("encode machine %s: %v", m.ID, err)) // plain data: cannot fail
	}
	return statefile.Op{Key: keyMachine + m.ID, Value: raw}
}

func (d *Document) metaOp() statefile.Op {
	raw, _ := json.Marshal(d.meta)
	return statefile.Op{Key: keyMeta, Value: raw}
}

func (d *Document) sortedIDs() []string {
	ids := make([]string, 0, len(d.machines))
	for id := range d.machines {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// --- reads ---

// Get returns a machine (immutable) or nil.
func (d *Document) Get(id string) *Machine {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.machines[id]
}

// All returns every machine sorted by id.
func (d *Document) All() []*Machine {
	d.mu.RLock()
	out := make([]*Machine, 0, len(d.machines))
	for _, m := range d.machines {
		out = append(out, m)
	}
	d.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Revision returns the newest revision.
func (d *Document) Revision() uint64 {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.meta.Rev
}

// Len returns the number of machines.
func (d *Document) Len() int {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return len(d.machines)
}

// List returns machines in revision order. With since set, only machines
// changed after that revision; states (if non-empty) filters; max > 0 caps
// the count. The returned cursor continues exactly after the last machine
// returned when the page was capped, and is the newest revision otherwise,
// so paging walks everything with no gaps.
func (d *Document) List(states map[State]bool, max int, since uint64, hasSince bool) ([]*Machine, uint64) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	start := d.head
	if hasSince {
		if since >= d.meta.Rev {
			return nil, d.meta.Rev
		}
		start = nil
		for m := d.tail; m != nil && m.Rev > since; m = m.prev {
			start = m
		}
	}
	var out []*Machine
	if !hasSince && len(states) == 0 {
		n := len(d.machines)
		if max > 0 && max < n {
			n = max
		}
		out = make([]*Machine, 0, n)
	}
	for m := start; m != nil; m = m.next {
		if len(states) > 0 && !states[m.State] {
			continue
		}
		out = append(out, m)
		if max > 0 && len(out) == max {
			if m.next == nil {
				break
			}
			return out, m.Rev
		}
	}
	return out, d.meta.Rev
}

// Cursor encodes a revision as an opaque List cursor bound to this
// document's lineage.
func (d *Document) Cursor(rev uint64) []byte {
	b := make([]byte, 0, 26)
	b = append(b, 'b', 'f', 1)
	lin, _ := hex.DecodeString(d.meta.Lineage)
	b = append(b, lin...)
	b = binary.BigEndian.AppendUint64(b, rev)
	sum := sha256.Sum256(b)
	return append(b, sum[:4]...)
}

// ParseCursor decodes a cursor; ok is false for anything this document did
// not produce (garbage, corruption, another lineage, a future revision).
func (d *Document) ParseCursor(c []byte) (uint64, bool) {
	lin, _ := hex.DecodeString(d.meta.Lineage)
	if len(c) != 3+len(lin)+8+4 || c[0] != 'b' || c[1] != 'f' || c[2] != 1 {
		return 0, false
	}
	body := c[:len(c)-4]
	sum := sha256.Sum256(body)
	if string(sum[:4]) != string(c[len(c)-4:]) || string(c[3:3+len(lin)]) != string(lin) {
		return 0, false
	}
	rev := binary.BigEndian.Uint64(c[3+len(lin):])
	if rev > d.Revision() {
		return 0, false
	}
	return rev, true
}

// Blob returns the in-memory bootstrap blob of a Configure in progress.
func (d *Document) Blob(id, opID string) ([]byte, bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	m := d.machines[id]
	if m == nil || m.Intent == nil || m.Intent.OpID != opID || m.blob == nil {
		return nil, false
	}
	return m.blob, true
}

// Pending returns the ids of machines with an intent, sorted.
func (d *Document) Pending() []string {
	d.mu.RLock()
	defer d.mu.RUnlock()
	var ids []string
	for id, m := range d.machines {
		if m.Intent != nil {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids
}

// Counts returns the number of machines per (state, zone, instance type).
func (d *Document) Counts() map[[3]string]int {
	d.mu.RLock()
	defer d.mu.RUnlock()
	out := map[[3]string]int{}
	for _, m := range d.machines {
		out[[3]string{m.State.String(), m.Zone, m.InstanceType}]++
	}
	return out
}

// Healthy reports the state store's health.
func (d *Document) Healthy() error { return d.opts.Store.Healthy() }

// --- mutations ---

// Mutate applies one mutating RPC: token shape, fence, existence,
// arguments, idempotency, position, then accept. It returns only after the
// accepted (or re-acknowledged) change is durable.
func (d *Document) Mutate(ctx context.Context, r Request) (Ack, error) {
	t := r.Token
	if t.Epoch < 0 || t.Seq < 0 {
		return Ack{}, errorf(CodeInvalid, "fencing token has a negative shard_epoch or sequence_number (%d, %d)", t.Epoch, t.Seq)
	}
	if r.MachineID == "" {
		return Ack{}, errorf(CodeInvalid, "machine_id is empty")
	}
	if r.Kind == KindDelete && !d.opts.DeleteSupported {
		return Ack{}, errorf(CodeUnimplemented, "Delete is not offered for bare_metal capacity: the pool's VMs are long-lived")
	}

	d.mu.Lock()
	var waitSeq uint64
	if !t.zero() {
		key := t.Shard + "\x00" + r.MachineID
		old, seen := d.fences[key]
		if seen && !(t.Epoch > old.Epoch || t.Epoch == old.Epoch && t.Seq > old.Seq) {
			d.mu.Unlock()
			return Ack{}, errorf(CodeFenced, "stale fencing token for shard %q on machine %s: (epoch %d, sequence %d) is not newer than the accepted (%d, %d)", t.Shard, r.MachineID, t.Epoch, t.Seq, old.Epoch, old.Seq)
		}
		// The mark advances even when the mutation is then rejected, also
		// for an id that does not exist (bounded: see MaxUnknownFences).
		nm := mark{Epoch: t.Epoch, Seq: t.Seq}
		d.fences[key] = nm
		raw, _ := json.Marshal(nm)
		ops := []statefile.Op{{Key: keyFence + key, Value: raw}}
		if _, exists := d.machines[r.MachineID]; !exists && !seen {
			ops = append(ops, d.trackUnknownFence(key)...)
		}
		waitSeq = d.opts.Store.Apply(ops...)
	}
	ack, err := d.mutateLocked(r)
	if ack.Machine != nil && ack.Machine.commitSeq > waitSeq {
		waitSeq = ack.Machine.commitSeq
	}
	accepted := err == nil && ack.Machine != nil && ack.Machine.Intent != nil && ack.Machine.Intent.OpID == ack.OpID
	d.mu.Unlock()

	if waitSeq > 0 {
		if werr := d.opts.Store.Wait(ctx, waitSeq); werr != nil {
			return Ack{}, errorf(CodeUnavailable, "state store: %v", werr)
		}
	}
	if err != nil {
		return Ack{}, err
	}
	if accepted && d.opts.Notify != nil {
		d.opts.Notify(r.MachineID)
	}
	return ack, nil
}

// trackUnknownFence remembers a fence key of an unknown machine id and
// returns the deletions that keep their number bounded. Callers hold mu.
func (d *Document) trackUnknownFence(key string) []statefile.Op {
	d.unknownFences = append(d.unknownFences, key)
	var ops []statefile.Op
	for len(d.unknownFences) > MaxUnknownFences {
		old := d.unknownFences[0]
		d.unknownFences = d.unknownFences[1:]
		if _, machine, _ := strings.Cut(old, "\x00"); d.machines[machine] == nil {
			delete(d.fences, old)
			ops = append(ops, statefile.Op{Key: keyFence + old, Delete: true})
		}
	}
	return ops
}

func (d *Document) mutateLocked(r Request) (Ack, error) {
	m := d.machines[r.MachineID]
	if m == nil {
		return Ack{}, errorf(CodeNotFound, "machine %s not found", r.MachineID)
	}
	fp := ""
	switch r.Kind {
	case KindConfigure:
		if r.Cluster == "" {
			return Ack{}, errorf(CodeInvalid, "cluster_id is empty")
		}
		if !utf8.ValidString(r.Cluster) {
			return Ack{}, errorf(CodeInvalid, "cluster_id is not valid UTF-8")
		}
		if len(r.Blob) > MaxBlobBytes {
			return Ack{}, errorf(CodeInvalid, "bootstrap_blob is %d bytes; the cap is %d bytes", len(r.Blob), MaxBlobBytes)
		}
		if err := checkMetadata(r.Metadata); err != nil {
			return Ack{}, err
		}
		fp = configureFingerprint(r)
	case KindDrain:
		if r.Grace < 0 {
			return Ack{}, errorf(CodeInvalid, "grace_period_seconds is negative (%d)", r.Grace)
		}
		fp = strconv.FormatInt(r.Grace, 10)
	}
	if m.State == Failed {
		return Ack{}, errorf(CodeConflict, "machine %s is FAILED and accepts no further transitions: %s", m.ID, m.LastError)
	}

	// Idempotency: a retry toward the same target returns the original op.
	rec, has := m.Ops[r.Kind]
	inTransition := m.Intent != nil && m.Intent.Kind == r.Kind
	settled := false
	switch r.Kind {
	case KindCreate:
		settled = m.State == Idle
	case KindConfigure:
		settled = m.State == Configured
	case KindDrain:
		settled = m.State == Idle
	case KindDelete:
		settled = m.State == Speculative
	}
	if has && (inTransition || settled) {
		if rec.Fingerprint != fp {
			return Ack{}, errorf(CodeConflict, "machine %s already accepted a %s (%s) with a different payload; it is rejected rather than silently merged", m.ID, r.Kind, rec.ID)
		}
		return Ack{OpID: rec.ID, Machine: m}, nil
	}

	from := map[Kind]State{KindCreate: Speculative, KindConfigure: Idle, KindDrain: Configured, KindDelete: Idle}[r.Kind]
	if r.Kind == KindDelete && m.State == Speculative {
		// Delete of a slot with no VM is an idempotent no-op; it still gets
		// an operation id, remembered for retries.
		n := m.clone()
		n.Ops[KindDelete] = OpRecord{ID: d.mintOp()}
		d.publish(n, d.metaOp())
		return Ack{OpID: n.Ops[KindDelete].ID, Machine: n}, nil
	}
	if m.State != from {
		return Ack{}, errorf(CodeConflict, "%s is not allowed on machine %s in state %s (it needs %s)", r.Kind, m.ID, m.State, from)
	}

	now := d.opts.Now()
	n := m.clone()
	op := d.mintOp()
	n.Intent = &Intent{Kind: r.Kind, OpID: op, Started: now, Deadline: now.Add(d.timeout(r.Kind, r.Grace)), GraceSeconds: r.Grace}
	n.Ops[r.Kind] = OpRecord{ID: op, Fingerprint: fp}
	n.Since = now
	n.LastError = ""
	switch r.Kind {
	case KindCreate:
		n.State = Creating
		n.Cycle++
		n.VMName = hypervisors.VMName(d.meta.Installation, n.ID, n.Cycle)
		n.VMID = 0
		delete(n.Ops, KindDelete)
		delete(n.Ops, KindConfigure)
		delete(n.Ops, KindDrain)
	case KindConfigure:
		n.State = Configuring
		n.Cluster = r.Cluster
		n.ShardMetadata = copyMap(r.Metadata)
		n.blob = append([]byte(nil), r.Blob...)
		delete(n.Ops, KindDrain)
	case KindDrain:
		n.State = Draining
	case KindDelete:
		n.State = Deleting
		delete(n.Ops, KindCreate)
		delete(n.Ops, KindConfigure)
		delete(n.Ops, KindDrain)
	}
	d.publish(n, d.metaOp())
	return Ack{OpID: op, Machine: n}, nil
}

func (d *Document) mintOp() string {
	d.meta.NextOp++
	return "op-" + strconv.FormatUint(d.meta.NextOp, 10)
}

func checkMetadata(md map[string]string) error {
	for k, v := range md {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return errorf(CodeInvalid, "shard_metadata entry %q is not valid UTF-8 (proto3 map<string,string> carries UTF-8 text; encode binary values, e.g. base64)", strconv.QuoteToASCII(k))
		}
	}
	if len(md) > MaxMetadataEntries {
		return errorf(CodeInvalid, "shard_metadata has %d entries; the cap is %d", len(md), MaxMetadataEntries)
	}
	total := 0
	for k, v := range md {
		total += len(k) + len(v)
	}
	if total > MaxMetadataBytes {
		return errorf(CodeInvalid, "shard_metadata holds %d bytes of keys and values; the cap is %d", total, MaxMetadataBytes)
	}
	return nil
}

func configureFingerprint(r Request) string {
	h := sha256.New()
	writeField := func(b []byte) {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	writeField([]byte(r.Cluster))
	keys := make([]string, 0, len(r.Metadata))
	for k := range r.Metadata {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		writeField([]byte(k))
		writeField([]byte(r.Metadata[k]))
	}
	writeField(r.Blob)
	return hex.EncodeToString(h.Sum(nil)[:12])
}

func copyMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	c := make(map[string]string, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// --- outcomes from the reconciler ---

// Result carries what a finished Create learned about its VM.
type Result struct {
	Host   string
	VMName string
	VMID   int
}

// Complete settles the transition opID of machine id at its target state.
// A completion for an intent that is no longer current (the machine failed
// or moved on) is discarded and reported as false.
func (d *Document) Complete(ctx context.Context, id, opID string, res Result) (bool, error) {
	d.mu.Lock()
	m := d.machines[id]
	if m == nil || m.Intent == nil || m.Intent.OpID != opID || !m.State.Transitional() {
		d.mu.Unlock()
		return false, nil
	}
	n := m.clone()
	n.Since = d.opts.Now()
	kind := n.Intent.Kind
	n.Intent = nil
	var seq uint64
	switch kind {
	case KindCreate:
		n.State = Idle
		n.Host = res.Host
		n.VMID = res.VMID
		if res.VMName != "" {
			n.VMName = res.VMName
		}
	case KindConfigure:
		n.State = Configured
		n.blob = nil
	case KindDrain:
		n.State = Idle
		n.Cluster = ""
		n.ShardMetadata = nil
	case KindDelete:
		n.State = Speculative
		n.Host, n.Cluster, n.ShardMetadata, n.VMID = "", "", nil, 0
		if n.Slotless {
			// Its offering is gone: once its VM is gone so is the machine.
			d.unlink(m)
			delete(d.machines, id)
			d.meta.Rev++
			seq = d.opts.Store.Apply(statefile.Op{Key: keyMachine + id, Delete: true}, d.metaOp())
			d.mu.Unlock()
			return true, d.opts.Store.Wait(ctx, seq)
		}
	}
	seq = d.publish(n)
	d.mu.Unlock()
	return true, d.opts.Store.Wait(ctx, seq)
}

// Fail moves a machine to FAILED with a reason. With opID set, only if that
// transition is still current; with opID empty, from any state but FAILED
// (a drift the shard must see, such as a vanished VM).
func (d *Document) Fail(ctx context.Context, id, opID, reason string) (bool, error) {
	d.mu.Lock()
	m := d.machines[id]
	if m == nil || m.State == Failed || opID != "" && (m.Intent == nil || m.Intent.OpID != opID) {
		d.mu.Unlock()
		return false, nil
	}
	n := m.clone()
	n.State = Failed
	n.Since = d.opts.Now()
	n.Intent = nil
	n.blob = nil
	if len(reason) > maxLastErrorBytes {
		reason = reason[:maxLastErrorBytes] + "…"
	}
	if strings.TrimSpace(reason) == "" {
		reason = "failed"
	}
	n.LastError = reason
	seq := d.publish(n)
	d.mu.Unlock()
	return true, d.opts.Store.Wait(ctx, seq)
}

// Adoption describes an owned VM found for a machine the document does not
// think has one.
type Adoption struct {
	MachineID    string
	Zone         string
	Host         string
	VMName       string
	VMID         int
	Cluster      string
	InstanceType string
	VCPU         int
	MemoryMiB    int
	Capacity     string
}

// Adopt records an owned, running VM: a SPECULATIVE machine becomes IDLE
// (or CONFIGURED if the VM carries a binding) with its host; an unknown id
// becomes a slotless machine so it stays visible and deletable.
func (d *Document) Adopt(ctx context.Context, a Adoption) (bool, error) {
	d.mu.Lock()
	m := d.machines[a.MachineID]
	var n *Machine
	now := d.opts.Now()
	switch {
	case m == nil:
		n = &Machine{ID: a.MachineID, Zone: a.Zone, InstanceType: a.InstanceType, Capacity: a.Capacity,
			VCPU: a.VCPU, MemoryMiB: a.MemoryMiB, Slotless: true, Ops: map[Kind]OpRecord{}, memo: &memo{}}
	case m.State == Speculative && m.Intent == nil:
		n = m.clone()
	default:
		d.mu.Unlock()
		return false, nil
	}
	n.State, n.Since, n.Host, n.VMName, n.VMID = Idle, now, a.Host, a.VMName, a.VMID
	if a.Cluster != "" {
		n.State, n.Cluster = Configured, a.Cluster
	}
	seq := d.publish(n)
	d.mu.Unlock()
	return true, d.opts.Store.Wait(ctx, seq)
}
