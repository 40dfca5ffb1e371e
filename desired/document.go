package desired

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Storage keys and the document format. Format 2 stores fence keys
// length-prefixed (format 1 joined shard and machine with a NUL, which was
// ambiguous); Open migrates a format-1 document.
const (
	formatVersion      = 2
	keyMachine         = "m/"
	keyFence           = "f/"
	keyMeta            = "meta/doc"
	defaultDrainMargin = 2 * time.Minute
)

// Slot is one offering slot as the inventory computed it.
type Slot struct {
	ID           string
	Zone         string
	InstanceType string
	Capacity     string
	VCPU         int
	MemoryMiB    int
	Source       int // inventory.InstanceType.Source
	Price        float64
	Resources    map[string]string
	Labels       map[string]string
}

// Options configure a Document.
type Options struct {
	Store Store
	// Warm, when set, is called once after Store.Load and returns a warm
	// standby's copy built from exactly the values Load returned (nil:
	// none). Open then takes its decoded, validated and indexed records
	// instead of reading every value again, if it was built against the
	// very slots Open is given.
	Warm func() *Warm
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
	// VMName derives a VM's name for one create cycle of a machine
	// (required; the server passes the adapters' naming rule).
	VMName func(installation, machineID string, cycle int) string
	// History bounds every machine's history (history.go).
	History HistoryOptions
	// Notify is called with a machine id once a change of its intent is
	// committed, to wake the reconciler. It runs on the store's callback
	// goroutine and must not block.
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
	CodeExhausted                        // ResourceExhausted: a fence budget is full
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
//
// It keeps two views. Writers work on the working view (work, fences,
// meta), which includes changes the store has not committed yet, so that
// racing mutations serialize. Readers (Get, List, All, Counts, Pending,
// Revision) see only the committed view (machines, log, rev), which a
// change reaches in the store's done callback, in commit order. A change
// that fails to commit is never visible, and since a store that failed
// stays failed, the document then refuses every further change.
type Document struct {
	opts Options
	// enc is where a txn encodes a machine record (under mu); see
	// copyOut.
	enc          []byte
	installation string
	lineageHex   string
	lineage      []byte

	mu sync.RWMutex
	// Working view.
	work   map[string]*Machine
	fences *fences
	epochs epochs
	meta   meta
	last   *change // newest change handed to the store
	// pending is, for each machine a change in flight writes or deletes,
	// the newest such change (until the store calls it back), so that
	// GetFresh waits for that one and not for changes to other machines
	// queued behind it. It holds only machines in flight.
	pending map[string]*change
	failed  error
	// refusing, when set, is why mutations are refused (a graceful stop).
	refusing string
	// Committed view.
	machines map[string]*Machine
	log      *revlog
	rev      uint64

	// hist is every machine's history; mu guards it.
	hist *history

	// rotor is where the next cursor-less capped List starts.
	rotor atomic.Uint64
}

// change is one atomic batch on its way to the store.
type change struct {
	puts   []*Machine
	dels   []string
	rev    uint64
	notify []string
	hist   []histMark // the histories written
	done   chan struct{}
	err    error
}

// LoadReport says what Open changed while reconciling the stored document
// with the offerings and recovering interrupted transitions.
type LoadReport struct {
	Added, Removed, Slotless, Redriven int
	// Lost is the store's report of acknowledged records an explicit
	// recovery dropped (LossKey), empty if none: Open then raised the
	// fence floors and started a new List lineage.
	Lost string
}

// loaded is a decoded stored document.
type loaded struct {
	meta     meta
	fresh    bool
	machines []*Machine // sorted by revision, then id (nil when log is set)
	marks    map[fenceKey]mark
	migrate  []Op // format-1 fence keys to rewrite
	epochs   epochs
	lost     []byte // the store's loss report (LossKey), nil if none

	// From a warm copy (Warm.load): the machines by id and, when they
	// arrived in order, by revision; pick are the only ones whose slot can
	// differ or that carry an intent, slotAt each slot's index and
	// withSlot how many machines have one. All nil from a plain load.
	byID     map[string]*Machine
	log      *revlog
	pick     map[string]struct{}
	slotAt   map[string]int
	withSlot int
}

// index is the loaded machines by id (a warm copy's own map), in a map
// with room for n.
func (ld *loaded) index(n int) map[string]*Machine {
	if ld.byID != nil {
		return ld.byID
	}
	m := make(map[string]*Machine, max(n, len(ld.machines)))
	for _, mc := range ld.machines {
		m[mc.ID] = mc
	}
	return m
}

// prepare decodes and validates one machine record, ready for a
// document.
func prepare(key string, raw []byte) (*Machine, error) {
	m := &Machine{}
	if err := json.Unmarshal(raw, m); err != nil {
		return nil, fmt.Errorf("state: decode machine %s: %w", Clip(strings.TrimPrefix(key, keyMachine), maxEcho), err)
	}
	if err := validMachine(key, m); err != nil {
		return nil, fmt.Errorf("state: record %s: %v: the document never writes such a value, so it is refused rather than served (the state was damaged, or written by something else)", Clip(key, maxEcho), err)
	}
	m.memo = &memo{}
	if m.Ops == nil {
		m.Ops = map[Kind]OpRecord{}
	}
	return m, nil
}

// sameSlice says whether a and b are the same slice (not only equal).
func sameSlice(a, b []Slot) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// sortByRev sorts machines by revision, then id.
func sortByRev(ms []*Machine) {
	slices.SortFunc(ms, func(a, b *Machine) int {
		if c := cmp.Compare(a.Rev, b.Rev); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
}

// decode reads a stored document. It checks the format and the
// installation id against opts, but changes nothing.
func decode(stored map[string][]byte, opts Options, w *Warm) (*loaded, error) {
	ld := &loaded{marks: map[fenceKey]mark{}}
	if raw, ok := stored[keyMeta]; ok {
		if err := json.Unmarshal(raw, &ld.meta); err != nil {
			return nil, fmt.Errorf("state: decode document header: %w", err)
		}
		if ld.meta.Version != 1 && ld.meta.Version != formatVersion {
			return nil, fmt.Errorf("state: document format version %d is not supported (want %d)", ld.meta.Version, formatVersion)
		}
	} else {
		ld.fresh = true
		ld.meta = meta{Version: formatVersion, Lineage: newLineage()}
	}
	switch {
	case ld.meta.Installation == "":
		ld.meta.Installation = opts.Installation
	case opts.Installation != "" && opts.Installation != ld.meta.Installation:
		return nil, fmt.Errorf("state: the state belongs to installation %q but --installation-id is %q; VMs are named and marked by installation, so changing it would orphan them", ld.meta.Installation, opts.Installation)
	}
	if ld.meta.Installation == "" {
		ld.meta.Installation = opts.DefaultInstallation
	}
	if ld.meta.Installation == "" {
		return nil, errors.New("state: no installation id")
	}
	if raw, ok := stored[keyEpochs]; ok {
		if err := json.Unmarshal(raw, &ld.epochs); err != nil {
			return nil, fmt.Errorf("state: decode fence epochs: %w", err)
		}
	}
	ld.lost = stored[LossKey]
	var fenceKeys []string
	if w != nil {
		if err := w.load(ld); err != nil {
			return nil, err
		}
		for k := range w.fences {
			fenceKeys = append(fenceKeys, k)
		}
	} else {
		for k, raw := range stored {
			switch {
			case strings.HasPrefix(k, keyMachine):
				m, err := prepare(k, raw)
				if err != nil {
					return nil, err
				}
				ld.machines = append(ld.machines, m)
				ld.meta.Rev = max(ld.meta.Rev, m.Rev)
			case strings.HasPrefix(k, keyFence):
				fenceKeys = append(fenceKeys, k)
			}
		}
		sortByRev(ld.machines)
	}
	var ids map[string]*Machine // format 1 only: its fence keys need the machine ids
	if ld.meta.Version == 1 && len(fenceKeys) > 0 {
		ids = ld.index(0)
	}
	for _, k := range fenceKeys {
		var fm mark
		if err := json.Unmarshal(stored[k], &fm); err != nil {
			return nil, fmt.Errorf("state: decode fence mark: %w", err)
		}
		body := strings.TrimPrefix(k, keyFence)
		var fk fenceKey
		var ok bool
		if ld.meta.Version == 1 {
			fk, ok = parseV1FenceKey(body, func(id string) bool { return ids[id] != nil })
			if ok {
				ld.migrate = append(ld.migrate, Op{Key: k, Delete: true}, Op{Key: fk.storeKey(), Value: stored[k]})
			}
		} else {
			fk, ok = parseFenceKey(body)
		}
		if !ok {
			return nil, fmt.Errorf("state: malformed fence key %s", Clip(k, maxEcho))
		}
		ld.marks[fk] = fm
	}
	return ld, nil
}

// Open loads the document from the store, reconciles it with the slots and
// recovers transitions interrupted by a restart; all of that is committed
// before Open returns.
func Open(ctx context.Context, opts Options, slots []Slot) (*Document, LoadReport, error) {
	var rep LoadReport
	if opts.VMName == nil {
		return nil, rep, errors.New("desired: Options.VMName is required")
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	stored, err := opts.Store.Load(ctx)
	if err != nil {
		return nil, rep, fmt.Errorf("state: load: %w", err)
	}
	var w *Warm
	if opts.Warm != nil {
		// Classified against other offerings, the copy's index would be
		// wrong: only the very slots it was built for are taken.
		if w = opts.Warm(); w != nil && !sameSlice(w.slots, slots) {
			w = nil
		}
	}
	ld, err := decode(stored, opts, w)
	if err != nil {
		return nil, rep, err
	}
	// The slots to compare with their machines: every one, or, from a
	// warm copy in which every slot has its machine, only those of the
	// machines it picked, in the offerings' order (the others match their
	// slot exactly).
	compare := slots
	if ld.pick != nil && ld.withSlot == len(slots) {
		at := make([]int, 0, len(ld.pick))
		for id := range ld.pick {
			if i, ok := ld.slotAt[id]; ok {
				at = append(at, i)
			}
		}
		slices.Sort(at)
		compare = make([]Slot, len(at))
		for k, i := range at {
			compare[k] = slots[i]
		}
	}
	work := ld.index(len(slots))
	if err := checkSlots(work, compare); err != nil {
		return nil, rep, err
	}
	log := ld.log
	if log == nil {
		log = newRevlog(max(len(slots), len(ld.machines)))
		for _, m := range ld.machines {
			log.put(m)
		}
	}
	d := &Document{
		opts:         opts,
		installation: ld.meta.Installation,
		lineageHex:   ld.meta.Lineage,
		lineage:      lineageBytes(ld.meta.Lineage),
		work:         work,
		fences:       newFences(),
		pending:      map[string]*change{},
		machines:     maps.Clone(work),
		log:          log,
		meta:         ld.meta,
		rev:          ld.meta.Rev,
		hist:         newHistory(opts.History),
	}
	d.meta.Version = formatVersion
	d.epochs = ld.epochs
	for k, m := range ld.marks {
		d.fences.add(k, m, d.work[k.machine] != nil)
	}

	now := opts.Now()
	histOps, err := d.hist.load(stored, now)
	if err != nil {
		return nil, rep, err
	}
	d.mu.Lock()
	t := d.begin()
	t.ops = append(t.ops, ld.migrate...)
	t.ops = append(t.ops, histOps...)
	if ld.lost != nil {
		// The store dropped acknowledged records: their fence marks are
		// unknown, so every epoch accepted so far is refused from now on,
		// and List cursors from before may name revisions that are gone,
		// so a new lineage makes every client list afresh.
		rep.Lost = string(ld.lost)
		d.epochs.lost()
		t.epochsDirty = true
		d.meta.Lineage = newLineage()
		d.lineageHex, d.lineage = d.meta.Lineage, lineageBytes(d.meta.Lineage)
		t.ops = append(t.ops, Op{Key: LossKey, Delete: true})
	}
	for id, r := range d.hist.rings {
		if !r.deleted.IsZero() && d.work[id] != nil {
			r.deleted = time.Time{} // its slot came back
			d.hist.dirty[id] = true
		}
	}
	withSlot := 0 // stored machines with a slot (counted when comparing every slot)
	for _, s := range compare {
		old := d.work[s.ID]
		if old == nil {
			t.put(&Machine{ID: s.ID, Zone: s.Zone, InstanceType: s.InstanceType, Capacity: s.Capacity,
				VCPU: s.VCPU, MemoryMiB: s.MemoryMiB, Source: s.Source, Price: s.Price,
				Resources: s.Resources, Labels: s.Labels, State: Speculative, Since: now,
				Ops: map[Kind]OpRecord{}, memo: &memo{}})
			d.fences.known(s.ID)
			rep.Added++
			continue
		}
		withSlot++
		if !slotMatches(old, s) {
			m := old.clone()
			m.Capacity, m.VCPU, m.MemoryMiB, m.Source = s.Capacity, s.VCPU, s.MemoryMiB, s.Source
			m.Price, m.Resources, m.Labels, m.Slotless = s.Price, s.Resources, s.Labels, false
			t.put(m)
		}
	}
	// The stored machines without a slot (in revision order), and those
	// whose interrupted transition is re-driven (in id order): from a warm
	// copy, among the machines it picked; otherwise among all.
	var slotless, redrive []*Machine
	if ld.pick != nil {
		for id := range ld.pick {
			if _, ok := ld.slotAt[id]; !ok {
				slotless = append(slotless, ld.byID[id])
			}
		}
		sortByRev(slotless)
	} else if withSlot < len(ld.machines) {
		inSlots := make(map[string]bool, len(slots))
		for _, s := range slots {
			inSlots[s.ID] = true
		}
		for _, old := range ld.machines {
			if !inSlots[old.ID] {
				slotless = append(slotless, old)
			}
		}
	}
	for _, old := range slotless {
		if old.State == Speculative {
			t.del(old.ID, CauseOffering)
			rep.Removed++
			continue
		}
		if !old.Slotless {
			m := old.clone()
			m.Slotless = true
			t.put(m)
			rep.Slotless++
		}
	}
	// Every interrupted transition is re-driven, in id order.
	if ld.pick != nil {
		for id := range ld.pick {
			if m := d.work[id]; m != nil && m.Intent != nil {
				redrive = append(redrive, m)
			}
		}
	} else {
		for _, m := range d.work {
			if m.Intent != nil {
				redrive = append(redrive, m)
			}
		}
	}
	slices.SortFunc(redrive, func(a, b *Machine) int { return strings.Compare(a.ID, b.ID) })
	for _, old := range redrive {
		// Every interrupted transition is re-driven from the durable
		// intent, with a fresh deadline: the time the provider was down
		// must not count against the hypervisor. A guest command it had
		// started is not started again: the record the guest keeps of it
		// (package guest) tells the executor whether it finished, still
		// runs or never started. Only a Configure whose blob never reached
		// the guest (it lives in memory only) cannot be run; it fails then.
		m := old.clone()
		m.Intent.Deadline = now.Add(d.timeout(m.Intent.Kind, m.Intent.GraceSeconds))
		rep.Redriven++
		t.put(m)
		// Not a transition of its own (the intent is durable already), so
		// the event rides along like a step's rather than growing this
		// commit by every interrupted machine's ring.
		d.hist.add(m.ID, m.Zone, Event{At: now, Kind: EventTransition, From: m.State.String(), To: m.State.String(),
			OpID: m.Intent.OpID, Cause: d.hist.o.Redrive})
	}
	t.writeMeta()
	c := t.commitSplit(maxOpenRecordBytes)
	d.mu.Unlock()
	if err := c.wait(ctx); err != nil {
		return nil, rep, fmt.Errorf("state: commit recovered document: %w", err)
	}
	return d, rep, nil
}

// maxOpenRecordBytes bounds one record of Open's first commit: a million
// new slots (or a quarter of a million with 1 KiB of labels each) would
// otherwise be one record of hundreds of MiB, over the journal's record
// limit (256 MiB) and far over what one etcd txn carries.
var maxOpenRecordBytes = 16 << 20

// commitSplit is commit for a change too large to be one record: the puts
// of machines the change writes once (new slots, changed offerings) go
// first, in records of at most limit bytes, each one atomic change of its
// own; everything else (deletes, a machine written twice, fence keys, the
// header) goes in the last. A crash in between leaves a document that
// loads: the machines of the records written, the header of before (the
// revision is the newest of the machines'), and the next Open writes the
// rest again. It returns the last change.
func (t *txn) commitSplit(limit int) *change {
	size := 0
	for _, op := range t.ops {
		size += len(op.Key) + len(op.Value)
	}
	if size <= limit {
		return t.commit()
	}
	d := t.d
	count := make(map[string]int, len(t.ops))
	for _, op := range t.ops {
		count[op.Key]++
	}
	byID := make(map[string]*Machine, len(t.c.puts))
	for _, m := range t.c.puts {
		byID[m.ID] = m
	}
	var rest []Op
	var chunk []Op
	var puts []*Machine
	bytes := 0
	flush := func() {
		if len(chunk) == 0 {
			return
		}
		c := &change{puts: puts, done: make(chan struct{})}
		for _, m := range puts {
			c.rev = max(c.rev, m.Rev)
		}
		d.handOff(c)
		d.opts.Store.Commit(chunk, func(err error) { d.settle(c, err) })
		chunk, puts, bytes = nil, nil, 0
	}
	moved := make(map[string]bool)
	for _, op := range t.ops {
		m := byID[strings.TrimPrefix(op.Key, keyMachine)]
		if op.Delete || !strings.HasPrefix(op.Key, keyMachine) || count[op.Key] != 1 || m == nil {
			rest = append(rest, op)
			continue
		}
		if bytes > 0 && bytes+len(op.Key)+len(op.Value) > limit {
			flush()
		}
		chunk = append(chunk, op)
		puts = append(puts, m)
		moved[m.ID] = true
		bytes += len(op.Key) + len(op.Value)
	}
	flush()
	t.ops = rest
	kept := t.c.puts[:0]
	for _, m := range t.c.puts {
		if !moved[m.ID] {
			kept = append(kept, m)
		}
	}
	t.c.puts = kept
	return t.commit()
}

// checkSlots refuses offerings that disagree with the stored document on
// where a known id lives.
func checkSlots(byID map[string]*Machine, slots []Slot) error {
	for _, s := range slots {
		if old := byID[s.ID]; old != nil && (old.Zone != s.Zone || old.InstanceType != s.InstanceType) {
			return fmt.Errorf("state: machine %s is recorded as %s in %s but the offerings now say %s in %s; ids are stable per (zone, type), so this state belongs to other offerings", s.ID, old.InstanceType, old.Zone, s.InstanceType, s.Zone)
		}
	}
	return nil
}

func slotMatches(m *Machine, s Slot) bool {
	return m.Capacity == s.Capacity && m.VCPU == s.VCPU && m.MemoryMiB == s.MemoryMiB &&
		m.Source == s.Source && m.Price == s.Price && !m.Slotless &&
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
func (d *Document) Installation() string { return d.installation }

// Lineage identifies this document's revision space.
func (d *Document) Lineage() string { return d.lineageHex }

func (d *Document) timeout(k Kind, grace int64) time.Duration {
	t := d.opts.Timeouts[k]
	if t <= 0 {
		t = 5 * time.Minute
	}
	if k == KindDrain {
		// A drain may take its whole grace period plus a margin; grace is
		// at most MaxGraceSeconds, so this cannot overflow.
		if g := time.Duration(min(grace, MaxGraceSeconds))*time.Second + defaultDrainMargin; g > t {
			t = g
		}
	}
	return t
}

// --- writing ---

// txn collects one atomic change; callers hold mu from begin to commit.
type txn struct {
	d *Document
	// hist names the machines whose history this change must carry (it
	// recorded their transitions).
	hist   map[string]bool
	ops    []Op
	c      *change
	puts   map[string]int // index in c.puts; nil until it holds more than maxScannedPuts
	dirty  bool           // meta must be written
	notify bool
	// epochsDirty: the fence epochs must be written.
	epochsDirty bool
	// background: no RPC's answer waits on this change (the reconciler's
	// records), so a BackgroundStore may hold it for a moment.
	background bool
}

func (d *Document) begin() *txn {
	// Room for a walk's txn (a machine, its history ring, the meta) in
	// one allocation rather than three growths.
	return &txn{d: d, c: &change{done: make(chan struct{})}, ops: make([]Op, 0, 4)}
}

// put makes m the machine's newest working value at a fresh revision.
func (t *txn) put(m *Machine) {
	d := t.d
	d.meta.Rev++
	m.Rev = d.meta.Rev
	d.work[m.ID] = m
	enc, err := appendMachine(d.enc[:0], m)
	if err != nil {
		panic(fmt.Sprintf("encode machine %s: %v", m.ID, err)) // plain data: cannot fail
	}
	raw := copyOut(&d.enc, enc) // d.enc is used under mu
	t.ops = append(t.ops, Op{Key: keyMachine + m.ID, Value: raw})
	if i, ok := t.putIndex(m.ID); ok {
		t.c.puts[i] = m
		return
	}
	if t.puts != nil {
		t.puts[m.ID] = len(t.c.puts)
	}
	t.c.puts = append(t.c.puts, m)
	if t.puts == nil && len(t.c.puts) > maxScannedPuts {
		t.puts = make(map[string]int, 2*len(t.c.puts))
		for i, p := range t.c.puts {
			t.puts[p.ID] = i
		}
	}
}

// maxScannedPuts is how many machines a txn puts before it indexes them
// in a map; most put one or two, which a scan finds at no allocation.
const maxScannedPuts = 8

// putIndex finds the machine id this txn already put, in c.puts.
func (t *txn) putIndex(id string) (int, bool) {
	if t.puts != nil {
		i, ok := t.puts[id]
		return i, ok
	}
	for i, p := range t.c.puts {
		if p.ID == id {
			return i, true
		}
	}
	return 0, false
}

// del removes a machine; its history stays for the retention.
func (t *txn) del(id, cause string) {
	d := t.d
	if m := d.work[id]; m != nil {
		t.event(m, Event{Kind: EventDeleted, From: m.State.String(), Cause: cause})
		d.hist.rings[id].deleted = d.opts.Now().UTC()
	}
	delete(d.work, id)
	d.fences.forgotten(id)
	d.meta.Rev++
	t.dirty = true
	t.ops = append(t.ops, Op{Key: keyMachine + id, Delete: true})
	t.c.dels = append(t.c.dels, id)
}

// fence records a mark.
func (t *txn) fence(k fenceKey, m mark) {
	t.d.fences.add(k, m, t.d.work[k.machine] != nil)
	raw, _ := json.Marshal(m)
	t.ops = append(t.ops, Op{Key: k.storeKey(), Value: raw})
}

func (t *txn) mintOp() string {
	t.d.meta.NextOp++
	t.dirty = true
	return "op-" + strconv.FormatUint(t.d.meta.NextOp, 10)
}

func (t *txn) writeMeta() { t.dirty = true }

// commit hands the change to the store; nil if there is nothing to write.
func (t *txn) commit() *change {
	d := t.d
	if t.dirty {
		raw, _ := json.Marshal(d.meta)
		t.ops = append(t.ops, Op{Key: keyMeta, Value: raw})
	}
	if t.epochsDirty {
		t.ops = append(t.ops, Op{Key: keyEpochs, Value: d.epochs.encode()})
	}
	if len(t.ops) > 0 {
		t.flushHistory(histRingsPerCommit)
	}
	if len(t.ops) == 0 {
		return nil
	}
	c := t.c
	c.rev = d.meta.Rev
	if t.notify {
		for _, m := range c.puts {
			c.notify = append(c.notify, m.ID)
		}
	}
	d.last = c
	d.handOff(c)
	done := func(err error) { d.settle(c, err) }
	if bs, ok := d.opts.Store.(BackgroundStore); ok && t.background {
		bs.CommitBackground(t.ops, done)
	} else {
		d.opts.Store.Commit(t.ops, done)
	}
	return c
}

// handOff records c as the change in flight for the machines it writes
// or deletes. Callers hold mu.
func (d *Document) handOff(c *change) {
	for _, m := range c.puts {
		d.pending[m.ID] = c
	}
	for _, id := range c.dels {
		d.pending[id] = c
	}
}

// settle is the store's done callback: it makes a committed change
// visible to readers, or records the failure that stops the document.
func (d *Document) settle(c *change, err error) {
	d.mu.Lock()
	for _, m := range c.puts {
		if d.pending[m.ID] == c {
			delete(d.pending, m.ID)
		}
	}
	for _, id := range c.dels {
		if d.pending[id] == c {
			delete(d.pending, id)
		}
	}
	switch {
	case err != nil:
		c.err = err
		if d.failed == nil {
			d.failed = err
		}
	case d.failed != nil:
		c.err = d.failed // a store that failed stays failed
	default:
		for _, id := range c.dels {
			delete(d.machines, id)
			d.log.remove(id)
		}
		for _, m := range c.puts {
			d.machines[m.ID] = m
			d.log.put(m)
		}
		d.rev = max(d.rev, c.rev)
		d.settleHistory(c)
	}
	d.mu.Unlock()
	// Notify before done: whoever waits for a change (an ack, Quiesce)
	// knows its machines were handed on.
	if c.err == nil && d.opts.Notify != nil {
		for _, id := range c.notify {
			d.opts.Notify(id)
		}
	}
	close(c.done)
}

// wait blocks until the change is committed or failed.
func (c *change) wait(ctx context.Context) error {
	if c == nil {
		return nil
	}
	select {
	case <-c.done: // settled wins over a context that also ended
		return c.err
	default:
	}
	select {
	case <-c.done:
		return c.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func unavailable(err error) *Error {
	return errorf(CodeUnavailable, "state store: %v", err)
}

// --- reads (committed view only) ---

// Get returns a committed machine (immutable) or nil.
func (d *Document) Get(id string) *Machine {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.machines[id]
}

// FreshWait bounds how long GetFresh waits for a change in flight: many
// group commits of a healthy store, short against any poll interval.
const FreshWait = 50 * time.Millisecond

// GetFresh is Get for a reader that would rather wait a moment than be
// handed a value already superseded (the Get RPC): while a change to the
// machine is on its way to the store, it waits until that change has
// settled, at most FreshWait and never past ctx, then returns the
// committed machine (immutable) or nil. Like Get it never returns a value
// the store has not committed: after a stalled store's FreshWait, or a
// failed commit, it is the older committed one.
//
// A machine has a change in flight while its working value is not its
// committed one; GetFresh waits for the newest change that writes or
// deletes it, not for changes to other machines handed to the store
// after it (those can be a group commit later).
func (d *Document) GetFresh(ctx context.Context, id string) *Machine {
	d.mu.RLock()
	m := d.machines[id]
	c := d.inflightFor(id)
	d.mu.RUnlock()
	if c == nil {
		return m
	}
	t := time.NewTimer(FreshWait)
	defer t.Stop()
	select {
	case <-c.done:
	case <-t.C:
	case <-ctx.Done():
	}
	return d.Get(id)
}

// inflightFor returns the change to wait for before machine id's newest
// value is committed, nil if it is; callers hold mu.
func (d *Document) inflightFor(id string) *change {
	if d.work[id] == d.machines[id] {
		return nil
	}
	if c := d.pending[id]; c != nil {
		return c
	}
	// Its change failed (the store called it back, the document has
	// stopped): the newest change covers whatever is still in flight.
	return d.last
}

// All returns every committed machine sorted by id.
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

// Select returns the committed machines keep is true for, sorted by id
// (only those are sorted: cheap when few of many are kept).
func (d *Document) Select(keep func(*Machine) bool) []*Machine {
	var out []*Machine
	d.mu.RLock()
	for _, m := range d.machines {
		if keep(m) {
			out = append(out, m)
		}
	}
	d.mu.RUnlock()
	slices.SortFunc(out, func(a, b *Machine) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Revision returns the newest committed revision.
func (d *Document) Revision() uint64 {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.rev
}

// Len returns the number of committed machines.
func (d *Document) Len() int {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return len(d.machines)
}

// List returns committed machines in revision order with the cursor that
// continues after them. states (if non-empty) filters; max > 0 caps the
// count. A cursor it cannot read is treated as none. Without a cursor an
// uncapped List returns everything and a cursor for deltas; a capped one
// starts where the previous cursor-less capped List stopped (see the walk
// phases in index.go), so consecutive pickers get different machines.
// Paging with the returned cursor walks the whole set with no gaps;
// a delta (a cursor from an uncapped List) returns exactly the machines
// changed after it.
func (d *Document) List(states map[State]bool, max int, raw []byte) ([]*Machine, []byte) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	c, ok := cursor{}, false
	if len(raw) > 0 {
		c, ok = d.decodeCursor(raw, d.rev)
	}
	rotate := false
	if !ok {
		c = cursor{phase: phaseDelta}
		if max > 0 {
			pivot := d.rotor.Load() + 1
			if pivot > d.rev {
				pivot = 1
			}
			c = cursor{phase: phaseUpper, pos: pivot - 1, pivot: pivot}
			rotate = true
		}
	}
	var out []*Machine
	if !ok && max == 0 && len(states) == 0 {
		out = make([]*Machine, 0, d.log.live())
	}
	out, next := d.log.walk(out, c, states, max, d.rev)
	if rotate && len(out) > 0 {
		d.rotor.Store(out[len(out)-1].Rev)
	}
	return out, d.encodeCursor(next)
}

// Cursor returns a delta cursor at the newest committed revision.
func (d *Document) Cursor() []byte {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.encodeCursor(cursor{phase: phaseDelta, pos: d.rev})
}

// Blob returns the in-memory bootstrap blob of a Configure in progress (an
// empty blob is a valid, empty file).
func (d *Document) Blob(id, opID string) ([]byte, bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	m := d.machines[id]
	if m == nil || m.Intent == nil || m.Intent.OpID != opID || m.blob == nil {
		return nil, false
	}
	return *m.blob, true
}

// Pending returns the ids of committed machines with an intent, sorted.
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

// Counts returns the number of committed machines per (state, zone,
// instance type).
func (d *Document) Counts() map[[3]string]int {
	d.mu.RLock()
	defer d.mu.RUnlock()
	out := map[[3]string]int{}
	for _, m := range d.machines {
		out[[3]string{m.State.String(), m.Zone, m.InstanceType}]++
	}
	return out
}

// Refuse makes every later mutation answer Unavailable with reason (a
// graceful stop, or a replica that stopped leading). Outcomes of the
// reconciler (Complete, Fail, Adopt, ExecStarting) are still recorded.
func (d *Document) Refuse(reason string) {
	d.mu.Lock()
	d.refusing = reason
	d.mu.Unlock()
}

// Quiesce waits until every change accepted before the call is committed
// (or failed) and its machines were handed to Options.Notify, or ctx
// ends. After Refuse it marks the moment from which no accepted mutation
// can still reach the reconciler: a graceful stop calls it before it
// stops the reconciler's queue, so a Drain accepted just before the stop
// is worked on, not dropped until the next start.
func (d *Document) Quiesce(ctx context.Context) error {
	d.mu.RLock()
	c := d.last // the store settles changes in Commit order
	d.mu.RUnlock()
	return c.wait(ctx)
}

// Healthy reports why the document cannot commit, nil while it can.
func (d *Document) Healthy() error {
	d.mu.RLock()
	failed := d.failed
	d.mu.RUnlock()
	if failed != nil {
		return failed
	}
	return d.opts.Store.Healthy()
}

// --- mutations ---

// Mutate applies one mutating RPC: token shape, fence, existence,
// arguments, idempotency, position, then accept. It returns only after the
// accepted (or re-acknowledged) change is committed.
func (d *Document) Mutate(ctx context.Context, r Request) (Ack, error) {
	// The ids form the fence key, so they are checked before fencing.
	if err := checkString("machine_id", r.MachineID, true, MaxIDBytes); err != nil {
		return Ack{}, err
	}
	if err := checkString("shard_id", r.Token.Shard, false, MaxIDBytes); err != nil {
		return Ack{}, err
	}

	d.mu.Lock()
	if d.failed != nil {
		d.mu.Unlock()
		return Ack{}, unavailable(d.failed)
	}
	if d.refusing != "" {
		d.mu.Unlock()
		return Ack{}, errorf(CodeUnavailable, "%s: mutations are refused; retry against the provider once it is back", d.refusing)
	}
	t := d.begin()
	if !r.Token.zero() {
		if floor, ok := d.epochs.floor(r.Token.Shard); ok && r.Token.Epoch <= floor {
			d.mu.Unlock()
			return Ack{}, errorf(CodeFenced, "stale fencing token for shard %s on machine %s: epoch %d; the state lost acknowledged records in a recovery, so this shard's epochs up to %d are refused: present a newer epoch",
				Clip(r.Token.Shard, maxEcho), Clip(r.MachineID, maxEcho), r.Token.Epoch, floor)
		}
		k := fenceKey{shard: r.Token.Shard, machine: r.MachineID}
		old, seen := d.fences.marks[k]
		if seen && !r.Token.newer(old) {
			d.mu.Unlock()
			return Ack{}, errorf(CodeFenced, "stale fencing token for shard %s on machine %s: (epoch %d, sequence %d) is not newer than the accepted (%d, %d)",
				Clip(r.Token.Shard, maxEcho), Clip(r.MachineID, maxEcho), r.Token.Epoch, r.Token.Seq, old.Epoch, old.Seq)
		}
		if !seen {
			if err := d.fences.admit(k, d.work[r.MachineID] != nil); err != nil {
				d.mu.Unlock()
				return Ack{}, err
			}
		}
		// The mark advances even when the mutation is then rejected.
		t.fence(k, mark{Epoch: r.Token.Epoch, Seq: r.Token.Seq})
		if d.epochs.observe(r.Token.Shard, r.Token.Epoch) {
			t.epochsDirty = true
		}
	}
	ack, err := d.mutateLocked(t, r)
	c := t.commit()
	if c == nil {
		c = d.last // a repeated ack waits for what is in flight
	}
	d.mu.Unlock()

	if werr := c.wait(ctx); werr != nil {
		return Ack{}, unavailable(werr)
	}
	if err != nil {
		return Ack{}, err
	}
	return ack, nil
}

func (d *Document) mutateLocked(t *txn, r Request) (Ack, error) {
	if r.Kind == KindDelete && !d.opts.DeleteSupported {
		return Ack{}, errorf(CodeUnimplemented, "Delete is not offered for bare_metal capacity: the pool's VMs are long-lived")
	}
	m := d.work[r.MachineID]
	if m == nil {
		return Ack{}, errorf(CodeNotFound, "machine %s not found", Clip(r.MachineID, maxEcho))
	}
	fp := ""
	grace := int64(0)
	switch r.Kind {
	case KindConfigure:
		if err := checkString("cluster_id", r.Cluster, true, MaxIDBytes); err != nil {
			return Ack{}, err
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
		grace = min(r.Grace, MaxGraceSeconds)
		fp = strconv.FormatInt(grace, 10)
	}
	if m.State == Failed {
		return Ack{}, errorf(CodeConflict, "machine %s is FAILED and accepts no further transitions: %s", m.ID, Clip(m.LastError, maxLastErrorBytes))
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
		if r.Kind == KindConfigure && inTransition && m.blob == nil {
			// A replica that took over (or restarted) has the intent but
			// not the blob, which lived only in the memory of the one that
			// accepted it. A retry of the same Configure (the fingerprint
			// covers the blob) hands it back, so the hook can still run.
			n := m.clone()
			blob := append(make([]byte, 0, len(r.Blob)), r.Blob...)
			n.blob = &blob
			t.notify = true
			t.put(n)
			return Ack{OpID: rec.ID, Machine: n}, nil
		}
		return Ack{OpID: rec.ID, Machine: m}, nil
	}

	from := map[Kind]State{KindCreate: Speculative, KindConfigure: Idle, KindDrain: Configured, KindDelete: Idle}[r.Kind]
	if r.Kind == KindDelete && m.State == Speculative {
		// Delete of a slot with no VM is an idempotent no-op; it still gets
		// an operation id, remembered for retries.
		n := m.clone()
		n.Ops[KindDelete] = OpRecord{ID: t.mintOp()}
		t.put(n)
		t.transition(m, n, n.Ops[KindDelete].ID, CauseRPC, "")
		return Ack{OpID: n.Ops[KindDelete].ID, Machine: n}, nil
	}
	if m.State != from {
		return Ack{}, errorf(CodeConflict, "%s is not allowed on machine %s in state %s (it needs %s)", r.Kind, m.ID, m.State, from)
	}

	now := d.opts.Now()
	n := m.clone()
	op := t.mintOp()
	n.Intent = &Intent{Kind: r.Kind, OpID: op, Started: now, Deadline: now.Add(d.timeout(r.Kind, grace)), GraceSeconds: grace}
	n.Ops[r.Kind] = OpRecord{ID: op, Fingerprint: fp}
	n.Since = now
	n.LastError = ""
	switch r.Kind {
	case KindCreate:
		n.State = Creating
		n.Cycle++
		n.VMName = d.vmName(n.ID, n.Cycle)
		n.VMID = 0
		delete(n.Ops, KindDelete)
		delete(n.Ops, KindConfigure)
		delete(n.Ops, KindDrain)
	case KindConfigure:
		n.State = Configuring
		n.Cluster = r.Cluster
		n.ShardMetadata = copyMap(r.Metadata)
		blob := append(make([]byte, 0, len(r.Blob)), r.Blob...)
		n.blob = &blob
		delete(n.Ops, KindDrain)
	case KindDrain:
		n.State = Draining
	case KindDelete:
		n.State = Deleting
		delete(n.Ops, KindCreate)
		delete(n.Ops, KindConfigure)
		delete(n.Ops, KindDrain)
	}
	t.notify = true
	t.put(n)
	t.transition(m, n, op, CauseRPC, "")
	return Ack{OpID: op, Machine: n}, nil
}

func (d *Document) vmName(id string, cycle int) string {
	return d.opts.VMName(d.installation, id, cycle)
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

// update applies f to the working value of machine id under the lock and
// commits what f put; f returns false to change nothing. Its callers are
// the reconciler's records, so the change is a background one.
func (d *Document) update(ctx context.Context, f func(t *txn) bool) (bool, error) {
	d.mu.Lock()
	if d.failed != nil {
		d.mu.Unlock()
		return false, unavailable(d.failed)
	}
	t := d.begin()
	t.background = true
	if !f(t) {
		d.mu.Unlock()
		return false, nil
	}
	c := t.commit()
	d.mu.Unlock()
	if err := c.wait(ctx); err != nil {
		return false, unavailable(err)
	}
	return true, nil
}

// Complete settles the transition opID of machine id at its target state.
// A completion for an intent that is no longer current (the machine failed
// or moved on) is discarded and reported as false.
func (d *Document) Complete(ctx context.Context, id, opID string, res Result) (bool, error) {
	return d.update(ctx, func(t *txn) bool {
		m := d.work[id]
		if m == nil || m.Intent == nil || m.Intent.OpID != opID || !m.State.Transitional() {
			return false
		}
		n := m.clone()
		n.Since = d.opts.Now()
		kind := n.Intent.Kind
		n.Intent = nil
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
				t.transition(m, n, opID, CauseDone, "")
				t.del(id, CauseOffering)
				return true
			}
		}
		t.put(n)
		t.transition(m, n, opID, CauseDone, "")
		return true
	})
}

// Fail moves a machine to FAILED with a reason. With opID set, only if that
// transition is still current; with opID empty, from any state but FAILED
// (a drift the shard must see, such as a vanished VM).
func (d *Document) Fail(ctx context.Context, id, opID, reason string) (bool, error) {
	return d.update(ctx, func(t *txn) bool {
		m := d.work[id]
		if m == nil || m.State == Failed || opID != "" && (m.Intent == nil || m.Intent.OpID != opID) {
			return false
		}
		n := m.clone()
		now := d.opts.Now()
		n.fail(now, reason)
		t.put(n)
		cause := CauseError
		switch {
		case m.Intent == nil || opID == "":
			cause = CauseDrift
		case !now.Before(m.Intent.Deadline):
			cause = CauseTimeout
		}
		t.transition(m, n, opID, cause, n.LastError)
		return true
	})
}

// ExecStarting durably records that a guest command of step is about to
// start for the transition opID, so that a transition re-driven after a
// restart or fail-over never starts it again. It fails if the transition
// is no longer current; the command must then not run.
func (d *Document) ExecStarting(ctx context.Context, id, opID, step string) error {
	ok, err := d.update(ctx, func(t *txn) bool {
		m := d.work[id]
		if m == nil || m.Intent == nil || m.Intent.OpID != opID {
			return false
		}
		n := m.clone()
		n.Intent.Execs = append(n.Intent.Execs, step)
		t.put(n)
		return true
	})
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("transition %s of machine %s is no longer current", opID, id)
	}
	return nil
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
//
// An adoption carrying a string the load checks would refuse (not UTF-8,
// oversized: a foreign or damaged VM) is not recorded, so nothing the
// hypervisor reports can make the state unreadable or List fail.
func (d *Document) Adopt(ctx context.Context, a Adoption) (bool, error) {
	for field, s := range map[string]string{"zone": a.Zone, "host": a.Host, "vm name": a.VMName,
		"instance type": a.InstanceType, "capacity": a.Capacity} {
		if storedString(field, s) != nil {
			return false, nil
		}
	}
	return d.update(ctx, func(t *txn) bool {
		m := d.work[a.MachineID]
		var n *Machine
		switch {
		case m == nil:
			if checkString("machine_id", a.MachineID, true, MaxIDBytes) != nil {
				return false // not an id a client could ever name
			}
			n = &Machine{ID: a.MachineID, Zone: a.Zone, InstanceType: a.InstanceType, Capacity: a.Capacity,
				VCPU: a.VCPU, MemoryMiB: a.MemoryMiB, Slotless: true, Ops: map[Kind]OpRecord{}, memo: &memo{}}
			d.fences.known(a.MachineID)
		case m.State == Speculative && m.Intent == nil:
			n = m.clone()
		default:
			return false
		}
		n.State, n.Since, n.Host, n.VMName, n.VMID = Idle, d.opts.Now(), a.Host, a.VMName, a.VMID
		if a.Cluster != "" && checkString("cluster", a.Cluster, true, MaxIDBytes) == nil {
			n.State, n.Cluster = Configured, a.Cluster
		}
		t.put(n)
		t.transition(m, n, "", CauseAdopt, "")
		return true
	})
}
