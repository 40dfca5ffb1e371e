package hypervisors

import "sync"

// EventKind says what an adapter event reports.
type EventKind string

const (
	// EventZoneUp: the adapter (re)connected to a zone; work that waited
	// for it can run now.
	EventZoneUp EventKind = "zone-up"
	// EventZoneDown: the adapter lost its connection to a zone.
	EventZoneDown EventKind = "zone-down"
	// EventVM: a VM changed (started, stopped, defined, undefined, ...),
	// whoever changed it.
	EventVM EventKind = "vm"
)

// Event is one change an adapter saw happen. It is a hint to look again,
// never a substitute for observing: the periodic pass stays the safety net.
type Event struct {
	Zone string
	Kind EventKind
	// VM is the VM (libvirt domain) name of an EventVM.
	VM string
	// MachineID is the machine the adapter knows the VM belongs to (from
	// its ownership marker or the define that made it); empty if unknown.
	MachineID string
	// Detail is a short human word ("stopped", "undefined", ...).
	Detail string
}

// EventSource is implemented by adapters that report changes as they
// happen. The channel is closed by Close.
type EventSource interface {
	Events() <-chan Event
}

// EventQueue delivers events without ever blocking the producer and
// without losing one: events pending delivery are coalesced by (zone,
// kind, vm), so the queue holds at most one entry per VM and zone state.
// The zero value is not usable; use NewEventQueue.
type EventQueue struct {
	mu      sync.Mutex
	order   []eventKey
	pending map[eventKey]Event
	wake    chan struct{}
	out     chan Event
	done    chan struct{}
	once    sync.Once
}

type eventKey struct {
	zone, vm string
	kind     EventKind
}

// NewEventQueue starts a queue; Close stops it and closes C.
func NewEventQueue() *EventQueue {
	q := &EventQueue{pending: map[eventKey]Event{}, wake: make(chan struct{}, 1),
		out: make(chan Event), done: make(chan struct{})}
	go q.run()
	return q
}

// C is the delivery channel.
func (q *EventQueue) C() <-chan Event { return q.out }

// Push queues ev (replacing a pending event with the same key).
func (q *EventQueue) Push(ev Event) {
	k := eventKey{ev.Zone, ev.VM, ev.Kind}
	q.mu.Lock()
	if _, ok := q.pending[k]; !ok {
		q.order = append(q.order, k)
	}
	q.pending[k] = ev
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// Close stops delivery; pending events are dropped.
func (q *EventQueue) Close() { q.once.Do(func() { close(q.done) }) }

func (q *EventQueue) run() {
	defer close(q.out)
	for {
		q.mu.Lock()
		var ev Event
		has := len(q.order) > 0
		if has {
			k := q.order[0]
			q.order = q.order[1:]
			ev = q.pending[k]
			delete(q.pending, k)
		}
		q.mu.Unlock()
		if !has {
			select {
			case <-q.wake:
				continue
			case <-q.done:
				return
			}
		}
		select {
		case q.out <- ev:
		case <-q.done:
			return
		}
	}
}
