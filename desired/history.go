package desired

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"
)

// A machine's history: a bounded ring of its newest events, kept with the
// document under keyHistory+id. The document never commits for an event
// alone while it serves: events ride along with commits that happen
// anyway, so the RPC path pays no extra fsync or etcd txn (its own record
// grows by the machine's ring). A transition's event is written in the
// same batch as the transition itself, so it is exactly as durable;
// steps, drift and guest commands recorded since the last commit are
// lost when the process dies before the next one (FlushHistory, called
// after every full pass, bounds how long that is). Readers see only
// events that are committed.
const keyHistory = "h/"

// History bounds. DefaultHistoryEvents and DefaultHistoryTotal are the
// flags' defaults; histRingsPerCommit bounds how many rings of other
// machines ride along with one commit.
const (
	DefaultHistoryEvents    = 50
	DefaultHistoryTotal     = 500_000
	DefaultHistoryRetention = 24 * time.Hour
	histRingsPerCommit      = 8
	histFlushRings          = 1024
	// MaxHistoryErrorBytes clips an event's error text.
	MaxHistoryErrorBytes = 512
	// maxHistoryTextBytes clips every other free-text field of an event.
	maxHistoryTextBytes = 256
)

// Event kinds.
const (
	EventTransition = "transition" // a state change (or a re-drive)
	EventStep       = "step"       // a plan step applied
	EventDrift      = "drift"      // drift seen and what was done
	EventGuest      = "guest"      // a guest command and its exit status
	EventDeleted    = "deleted"    // the machine left the document
)

// Causes of a transition event.
const (
	CauseRPC      = "rpc"
	CauseDone     = "completed"
	CauseTimeout  = "timeout"
	CauseError    = "error"
	CauseDrift    = "drift"
	CauseAdopt    = "adopt"
	CauseRestart  = "restart re-drive"
	CauseFailover = "fail-over re-drive"
	CauseOffering = "offering removed"
)

// Event is one entry of a machine's history.
type Event struct {
	Seq        uint64    `json:"seq"`
	At         time.Time `json:"at"`
	Kind       string    `json:"kind"`
	From       string    `json:"from,omitempty"`
	To         string    `json:"to,omitempty"`
	OpID       string    `json:"op_id,omitempty"`
	Cause      string    `json:"cause,omitempty"`
	Action     string    `json:"action,omitempty"`
	Reason     string    `json:"reason,omitempty"`
	DurationMS int64     `json:"duration_ms,omitempty"`
	Outcome    string    `json:"outcome,omitempty"`
	Class      string    `json:"class,omitempty"`
	Error      string    `json:"error,omitempty"`
	Exit       *int      `json:"exit,omitempty"`
}

// HistoryOptions bound the history (zero values take the defaults).
type HistoryOptions struct {
	// Events is the ring size per machine.
	Events int
	// Total bounds the events held for all machines together; the
	// oldest events go first.
	Total int
	// Retention is how long the history of a machine that left the
	// document is kept.
	Retention time.Duration
	// Redrive is the cause recorded for transitions Open re-drives
	// (CauseRestart by default; the etcd store says CauseFailover).
	Redrive string
}

type histEntry struct {
	seq uint64
	at  int64 // unix nanoseconds
	raw []byte
}

type ring struct {
	entries []histEntry // oldest first
	next    uint64      // the next event's seq
	durable uint64      // the newest seq a committed record holds
	zone    string
	deleted time.Time // when the machine left the document; zero while it is in it
}

type fifoEntry struct {
	id  string
	seq uint64
}

// history is every machine's ring; the document's mu guards it.
type history struct {
	o     HistoryOptions
	rings map[string]*ring
	count int
	// fifo lists held events in the order they were added, for the total
	// bound; entries whose event a ring already dropped are skipped, and
	// compacted once they are half of it.
	fifo  []fifoEntry
	dirty map[string]bool
	// scratch is where add encodes an event before copying it out at its
	// exact size (growing a buffer from nothing took several allocations
	// per event); see copyOut.
	scratch []byte
}

// maxScratch bounds an encoding buffer kept between encodings (a
// history's, a document's); events and machine records are far smaller.
const maxScratch = 64 << 10

// copyOut returns enc, encoded into *scratch, copied at its exact size,
// and keeps enc's buffer in *scratch for the next encoding unless it grew
// above maxScratch.
func copyOut(scratch *[]byte, enc []byte) []byte {
	raw := bytes.Clone(enc)
	if *scratch = enc[:0]; cap(enc) > maxScratch {
		*scratch = nil
	}
	return raw
}

func newHistory(o HistoryOptions) *history {
	if o.Events <= 0 {
		o.Events = DefaultHistoryEvents
	}
	if o.Total <= 0 {
		o.Total = DefaultHistoryTotal
	}
	if o.Retention <= 0 {
		o.Retention = DefaultHistoryRetention
	}
	if o.Redrive == "" {
		o.Redrive = CauseRestart
	}
	return &history{o: o, rings: map[string]*ring{}, dirty: map[string]bool{}}
}

// add appends ev to id's ring and marks it dirty; it returns the seq.
func (h *history) add(id, zone string, ev Event) uint64 {
	r := h.rings[id]
	if r == nil {
		r = &ring{next: 1}
		h.rings[id] = r
	}
	if zone != "" {
		r.zone = zone
	}
	r.deleted = time.Time{}
	ev.Seq = r.next
	r.next++
	ev.Error = clipText(ev.Error, MaxHistoryErrorBytes)
	ev.Reason = clipText(ev.Reason, maxHistoryTextBytes)
	ev.Cause = clipText(ev.Cause, maxHistoryTextBytes)
	ev.Action = clipText(ev.Action, maxHistoryTextBytes)
	ev.At = ev.At.UTC()
	enc, err := appendEvent(h.scratch[:0], &ev)
	if err != nil {
		panic(fmt.Sprintf("encode event of %s: %v", id, err)) // plain data: cannot fail
	}
	raw := copyOut(&h.scratch, enc)
	if len(r.entries) >= h.o.Events {
		h.trimRing(r, h.o.Events-1)
	}
	r.entries = append(r.entries, histEntry{seq: ev.Seq, at: ev.At.UnixNano(), raw: raw})
	h.count++
	h.fifo = append(h.fifo, fifoEntry{id: id, seq: ev.Seq})
	h.dirty[id] = true
	h.enforceTotal()
	return ev.Seq
}

// trimRing drops the oldest events of r beyond keep and adjusts count.
func (h *history) trimRing(r *ring, keep int) {
	if len(r.entries) <= keep {
		return
	}
	drop := len(r.entries) - keep
	h.count -= drop
	r.entries = r.entries[drop:]
}

// enforceTotal drops the globally oldest events until count fits Total.
func (h *history) enforceTotal() {
	for h.count > h.o.Total && len(h.fifo) > 0 {
		f := h.fifo[0]
		h.fifo = h.fifo[1:]
		r := h.rings[f.id]
		if r == nil || len(r.entries) == 0 || r.entries[0].seq != f.seq {
			continue // already dropped by its ring
		}
		r.entries = r.entries[1:]
		h.count--
		h.dirty[f.id] = true
	}
	if len(h.fifo) > 2*h.count+1024 {
		live := make([]fifoEntry, 0, h.count)
		for _, f := range h.fifo {
			if r := h.rings[f.id]; r != nil && len(r.entries) > 0 && f.seq >= r.entries[0].seq {
				live = append(live, f)
			}
		}
		h.fifo = live
	}
}

// encode is the stored record of a ring.
func (r *ring) encode() []byte {
	// One allocation of the record's size (the zone unescaped, the
	// deletion time at its longest): rings are written on every commit
	// that carries an event.
	n := len(`{"v":1,"zone":""`) + len(r.zone) + len(`,"deleted":""`) + len(time.RFC3339Nano) + len(`,"events":[`) + len("]}")
	for _, e := range r.entries {
		n += len(e.raw) + 1
	}
	b := make([]byte, 0, n)
	b = append(b, `{"v":1,"zone":`...)
	b = appendString(b, r.zone)
	if !r.deleted.IsZero() {
		b = append(b, `,"deleted":`...)
		b, _ = appendTime(b, r.deleted.UTC()) // a time of this process: in range
	}
	b = append(b, `,"events":[`...)
	for i, e := range r.entries {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, e.raw...)
	}
	return append(b, "]}"...)
}

// storedRing is the stored record of a ring as decoded.
type storedRing struct {
	V       int               `json:"v"`
	Zone    string            `json:"zone"`
	Deleted time.Time         `json:"deleted"`
	Events  []json.RawMessage `json:"events"`
}

// StoredHistory is one machine's history as a store holds it.
type StoredHistory struct {
	Zone string
	// Deleted is when the machine left the document, zero while it is in it.
	Deleted time.Time
	Events  []Event
}

// decodeRing reads one stored ring.
func decodeRing(k string, raw []byte) (*storedRing, []Event, error) {
	var sr storedRing
	if err := json.Unmarshal(raw, &sr); err != nil {
		return nil, nil, fmt.Errorf("state: decode history %s: %w", Clip(k, maxEcho), err)
	}
	if sr.V != 1 {
		return nil, nil, fmt.Errorf("state: history %s: record version %d is not supported (want 1)", Clip(k, maxEcho), sr.V)
	}
	evs := make([]Event, len(sr.Events))
	for i, e := range sr.Events {
		if err := json.Unmarshal(e, &evs[i]); err != nil {
			return nil, nil, fmt.Errorf("state: decode history %s: event %d: %w", Clip(k, maxEcho), i, err)
		}
	}
	return &sr, evs, nil
}

// ReadHistory decodes the histories a store holds (offline reading:
// `provider history --state`). A document written before histories were
// kept has none.
func ReadHistory(stored map[string][]byte) (map[string]StoredHistory, error) {
	out := map[string]StoredHistory{}
	for k, raw := range stored {
		if !strings.HasPrefix(k, keyHistory) {
			continue
		}
		sr, evs, err := decodeRing(k, raw)
		if err != nil {
			return nil, err
		}
		out[strings.TrimPrefix(k, keyHistory)] = StoredHistory{Zone: sr.Zone, Deleted: sr.Deleted, Events: evs}
	}
	return out, nil
}

// load puts the stored rings in h, trimmed to the bounds; rings past
// retention are deleted by ops returned.
func (h *history) load(stored map[string][]byte, now time.Time) ([]Op, error) {
	type loadedRing struct {
		id string
		r  *ring
	}
	var all []loadedRing
	var ops []Op
	for k, raw := range stored {
		if !strings.HasPrefix(k, keyHistory) {
			continue
		}
		sr, evs, err := decodeRing(k, raw)
		if err != nil {
			return nil, err
		}
		id := strings.TrimPrefix(k, keyHistory)
		if !sr.Deleted.IsZero() && now.Sub(sr.Deleted) > h.o.Retention {
			ops = append(ops, Op{Key: k, Delete: true})
			continue
		}
		r := &ring{zone: sr.Zone, deleted: sr.Deleted, next: 1}
		for i, ev := range evs {
			r.entries = append(r.entries, histEntry{seq: ev.Seq, at: ev.At.UnixNano(), raw: sr.Events[i]})
			r.next = max(r.next, ev.Seq+1)
		}
		r.durable = r.next - 1
		h.rings[id] = r
		h.count += len(r.entries)
		if len(r.entries) > h.o.Events {
			h.trimRing(r, h.o.Events)
			h.dirty[id] = true
		}
		all = append(all, loadedRing{id, r})
	}
	// The fifo in time order, so the total bound drops the oldest first.
	type timed struct {
		f  fifoEntry
		at int64
	}
	var order []timed
	for _, lr := range all {
		for _, e := range lr.r.entries {
			order = append(order, timed{fifoEntry{id: lr.id, seq: e.seq}, e.at})
		}
	}
	sort.SliceStable(order, func(i, j int) bool { return order[i].at < order[j].at })
	for _, o := range order {
		h.fifo = append(h.fifo, o.f)
	}
	h.enforceTotal()
	return ops, nil
}

// histMark is a ring written in a change: seq is its newest event then.
type histMark struct {
	id  string
	seq uint64
	del bool
}

// event records ev for machine m in this txn: its ring is written with
// the change, so the event is as durable as the change.
func (t *txn) event(m *Machine, ev Event) {
	d := t.d
	if ev.At.IsZero() {
		ev.At = d.opts.Now()
	}
	d.hist.add(m.ID, m.Zone, ev)
	if t.hist == nil {
		t.hist = map[string]bool{}
	}
	t.hist[m.ID] = true
}

// transition records a state change of m (the new value) from old.
func (t *txn) transition(old *Machine, m *Machine, op, cause, reason string) {
	from := ""
	if old != nil {
		from = old.State.String()
	}
	t.event(m, Event{Kind: EventTransition, From: from, To: m.State.String(), OpID: op, Cause: cause, Error: reason})
}

// flushHistory adds the rings this change must carry (t.hist) and up to
// limit more dirty rings to the change. It runs under mu, in commit.
func (t *txn) flushHistory(limit int) {
	d := t.d
	h := d.hist
	write := func(id string) {
		r := h.rings[id]
		delete(h.dirty, id)
		if r == nil {
			return
		}
		if len(r.entries) == 0 && !r.deleted.IsZero() {
			delete(h.rings, id)
			t.ops = append(t.ops, Op{Key: keyHistory + id, Delete: true})
			t.c.hist = append(t.c.hist, histMark{id: id, del: true})
			return
		}
		t.ops = append(t.ops, Op{Key: keyHistory + id, Value: r.encode()})
		t.c.hist = append(t.c.hist, histMark{id: id, seq: r.next - 1})
	}
	for _, id := range sortedSet(t.hist) {
		write(id)
	}
	n := 0
	for id := range h.dirty {
		if n >= limit {
			break
		}
		write(id)
		n++
	}
}

func sortedSet(s map[string]bool) []string {
	out := make([]string, 0, len(s))
	for k := range s {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// settleHistory makes the rings a committed change wrote readable.
func (d *Document) settleHistory(c *change) {
	for _, m := range c.hist {
		if r := d.hist.rings[m.id]; r != nil && !m.del {
			r.durable = max(r.durable, m.seq)
		}
	}
}

// Record adds ev to machine id's history. It does not commit: the event
// rides along with the next commit (a transition, an outcome, or
// FlushHistory), and until then readers do not see it. Events of a
// machine the document does not hold are dropped.
func (d *Document) Record(id string, ev Event) {
	d.mu.Lock()
	defer d.mu.Unlock()
	m := d.work[id]
	if m == nil {
		return
	}
	if ev.At.IsZero() {
		ev.At = d.opts.Now()
	}
	d.hist.add(id, m.Zone, ev)
}

// FlushHistory commits the histories recorded since their last commit,
// and drops the histories of machines that left the document longer ago
// than the retention. It commits nothing when nothing changed. The
// reconciler calls it after every full pass; it is never on the RPC path.
func (d *Document) FlushHistory(ctx context.Context) error {
	for {
		d.mu.Lock()
		if d.failed != nil {
			d.mu.Unlock()
			return unavailable(d.failed)
		}
		now := d.opts.Now()
		for id, r := range d.hist.rings {
			if !r.deleted.IsZero() && now.Sub(r.deleted) > d.hist.o.Retention {
				d.hist.count -= len(r.entries)
				r.entries = nil
				d.hist.dirty[id] = true
			}
		}
		if len(d.hist.dirty) == 0 {
			d.mu.Unlock()
			return nil
		}
		t := d.begin()
		t.flushHistory(histFlushRings)
		more := len(d.hist.dirty) > 0
		c := t.commit()
		d.mu.Unlock()
		if err := c.wait(ctx); err != nil {
			return unavailable(err)
		}
		if !more {
			return nil
		}
	}
}

// MachineHistory is a machine's committed history.
type MachineHistory struct {
	ID   string
	Zone string
	// State is the machine's committed state; empty for a machine that
	// left the document (Deleted says when).
	State   string
	Deleted time.Time
	Events  []Event
}

func (d *Document) committedEvents(r *ring, since int64) []Event {
	var out []Event
	for _, e := range r.entries {
		if e.seq > r.durable || e.at < since {
			continue
		}
		var ev Event
		if json.Unmarshal(e.raw, &ev) == nil {
			out = append(out, ev)
		}
	}
	return out
}

// History returns the committed history of machine id; false if there is
// none.
func (d *Document) History(id string) (MachineHistory, bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	r := d.hist.rings[id]
	m := d.machines[id]
	if r == nil && m == nil {
		return MachineHistory{}, false
	}
	h := MachineHistory{ID: id}
	if m != nil {
		h.Zone, h.State = m.Zone, m.State.String()
	}
	if r != nil {
		if h.Zone == "" {
			h.Zone = r.zone
		}
		h.Deleted = r.deleted
		h.Events = d.committedEvents(r, 0)
	}
	return h, true
}

// Histories returns the committed histories with events at or after
// since, of machines in zone and state (empty: any), sorted by id; a
// machine that left the document matches the state "DELETED".
func (d *Document) Histories(since time.Time, zone, state string) []MachineHistory {
	d.mu.RLock()
	defer d.mu.RUnlock()
	var out []MachineHistory
	for id, r := range d.hist.rings {
		h := MachineHistory{ID: id, Zone: r.zone, Deleted: r.deleted}
		if m := d.machines[id]; m != nil {
			h.Zone, h.State = m.Zone, m.State.String()
		} else {
			h.State = "DELETED"
		}
		if zone != "" && h.Zone != zone || state != "" && h.State != state {
			continue
		}
		h.Events = d.committedEvents(r, since.UnixNano())
		if len(h.Events) > 0 {
			out = append(out, h)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// HistoryStats says how many events the histories hold and for how many
// machines.
func (d *Document) HistoryStats() (events, machines int) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.hist.count, len(d.hist.rings)
}
