package proxmox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvemarker"
)

// The poller lists the cluster once per PollInterval. Each answer (or
// failure) sets every configured node's health, and the VMs of this
// installation are diffed against the previous answer: each one that
// appeared, vanished or changed (power, name, tags, size, pool, node) is
// pushed as an EventVM. A poll answering nothing new pushes nothing.

// zoneState is a node's health as the poller last announced it.
type zoneState int

const (
	zoneConnecting zoneState = iota // no poll has answered or failed yet
	zoneUp
	zoneDown
)

// nodeHealth is what the polls said of one node.
type nodeHealth struct {
	state zoneState
	// since is when the node stopped being up (Config.Now), for down.
	since time.Time
	// why the node is down; detail is its short word for events.
	why    error
	detail string
	// announced is the state last logged and pushed as an event.
	announced zoneState
}

// vmState is what the listing shows of one VM of this installation.
type vmState struct {
	node, name, status, tags, pool string
	maxMem, maxCPU                 uint64
	// machine is the machine id the adapter knows for the VM ("" if none).
	machine string
}

// startPolling runs the poller until Close: one poll at once, then one
// per value received from ticks (a tick that arrives while a poll runs is
// not queued twice: time.Ticker drops it); stop, if set, is called when
// it ends.
func (a *Adapter) startPolling(ticks <-chan time.Time, stop func()) {
	a.healthMu.Lock()
	a.polling = true
	a.healthMu.Unlock()
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		if stop != nil {
			defer stop()
		}
		for {
			a.pollOnce(a.ctx)
			select {
			case <-a.ctx.Done():
				return
			case <-ticks:
			}
		}
	}()
}

// pollOnce makes one poll: one GET /cluster/resources at most (none when a
// listing sent after this poll began arrived while it waited for listSem),
// bounded by PollTimeout. While it is unanswered for StallAfter, every
// node reports down.
func (a *Adapter) pollOnce(ctx context.Context) {
	sent, mono := a.cfg.Now(), time.Now()
	a.healthMu.Lock()
	a.pending, a.pendingAt = mono, sent
	a.healthMu.Unlock()
	stall := time.AfterFunc(a.cfg.StallAfter, func() {
		// Unanswered this long, the API counts as down: the last good
		// listing must stop serving Observe, as after a failed poll.
		a.dropListing()
		a.publish()
	})
	pctx, cancel := context.WithTimeout(ctx, a.cfg.PollTimeout)
	l, err := a.pollListing(pctx, sent)
	timedOut := errors.Is(pctx.Err(), context.DeadlineExceeded)
	cancel()
	stall.Stop()
	if ctx.Err() != nil {
		return // closing: the adapter reports nothing any more
	}
	detail := "api error"
	if err != nil && timedOut {
		err = fmt.Errorf("no answer from the API within %s: %w", a.cfg.PollTimeout, hypervisors.ErrTransient)
		detail = "not answering"
	}
	if err != nil {
		// The last good listing must not keep serving Observe as if the
		// API answered: Observe asks again and sees the failure itself.
		a.dropListing()
	}
	a.record(sent, l, err, detail)
	a.publish()
	if err == nil {
		a.diff(l)
	}
	a.polls.Add(1)
	if a.afterPoll != nil {
		a.afterPoll()
	}
}

// pollListing returns a listing sent after sent: its own, or one another
// caller fetched while the poll waited for listSem.
func (a *Adapter) pollListing(ctx context.Context, sent time.Time) (*listing, error) {
	if err := a.lockList(ctx); err != nil {
		return nil, fmt.Errorf("list cluster resources: wait for the listing in flight: %w", err)
	}
	defer a.unlockList()
	if l := a.cachedListing(sent); l != nil {
		return l, nil
	}
	return a.fetchAndCache(ctx)
}

// maxDetail bounds the node status quoted from the API.
const maxDetail = 32

// nodeProblem says why the listing l shows node n as not usable (nil when
// it is online), after a short detail for /readyz. A node that is not
// online lists its VMs as "unknown": its zone is unknown, not a zone of VMs
// in unknown power.
func nodeProblem(l *listing, n string) (detail string, why error) {
	switch st := l.nodes[n]; st {
	case nodeOnline:
		return "", nil
	case "":
		return "not in cluster", errors.New("node not in the cluster's node list")
	default:
		if len(st) > maxDetail {
			st = st[:maxDetail]
		}
		return st, fmt.Errorf("the cluster reports the node %q", st)
	}
}

// record sets every configured node's health from one poll: err (with its
// short word errDetail) when it failed, else the node's status in l.
func (a *Adapter) record(sent time.Time, l *listing, err error, errDetail string) {
	a.healthMu.Lock()
	defer a.healthMu.Unlock()
	a.pending = time.Time{}
	for _, n := range a.cfg.Nodes {
		h := a.health[n]
		why, detail := err, errDetail
		if err == nil {
			detail, why = nodeProblem(l, n)
		}
		if why == nil {
			h.state, h.since, h.why, h.detail = zoneUp, time.Time{}, nil, ""
			continue
		}
		if h.state != zoneDown {
			h.since = sent
		}
		h.state, h.why, h.detail = zoneDown, why, detail
	}
}

// stateLocked is a node's health now (healthMu held): its state, a short
// word for events, and nil when up, else an error wrapping ErrUnreachable
// that does not name the node.
func (a *Adapter) stateLocked(n string, mono time.Time) (zoneState, string, error) {
	h := a.health[n]
	if !a.pending.IsZero() {
		if waited := mono.Sub(a.pending); waited >= a.cfg.StallAfter {
			since := a.pendingAt
			if h.state == zoneDown && h.since.Before(since) {
				since = h.since
			}
			return zoneDown, "not answering", fmt.Errorf("%w: down since %s: no answer from the API for %s", hypervisors.ErrUnreachable,
				since.UTC().Format(time.RFC3339), waited.Round(100*time.Millisecond))
		}
	}
	switch h.state {
	case zoneConnecting:
		return zoneConnecting, "", fmt.Errorf("%w: connecting: first cluster listing in progress", hypervisors.ErrUnreachable)
	case zoneUp:
		return zoneUp, "", nil
	}
	return zoneDown, h.detail, fmt.Errorf("%w: down since %s: %w", hypervisors.ErrUnreachable, h.since.UTC().Format(time.RFC3339), h.why)
}

// publish logs and pushes every node whose health changed since it was
// last announced: EventZoneUp when it became up, EventZoneDown when it
// stopped being up.
func (a *Adapter) publish() {
	mono := time.Now()
	var evs []hypervisors.Event
	a.healthMu.Lock()
	for _, n := range a.cfg.Nodes {
		h := a.health[n]
		st, detail, err := a.stateLocked(n, mono)
		if st == h.announced {
			continue
		}
		was := h.announced
		h.announced = st
		switch {
		case st == zoneUp:
			a.log.Info("proxmox node up", "zone", n)
			evs = append(evs, hypervisors.Event{Zone: n, Kind: hypervisors.EventZoneUp})
		case st == zoneDown:
			a.log.Warn("proxmox node down", "zone", n, "err", err)
			if was == zoneUp {
				evs = append(evs, hypervisors.Event{Zone: n, Kind: hypervisors.EventZoneDown, Detail: detail})
			}
		}
	}
	a.healthMu.Unlock()
	for _, ev := range evs {
		a.events.Push(ev)
	}
}

// ZoneHealth implements hypervisors.HealthReporter from the poller: every
// node is "connecting" until the first poll ends, up while the last poll
// listed it online, and "down since <t>: <reason>" when the cluster lists
// it otherwise, when the last poll failed, or while the poll in flight has
// gone unanswered for StallAfter. Nil when polling is off (PollInterval
// < 0): then only observation says whether a zone answers.
func (a *Adapter) ZoneHealth() map[string]error {
	mono := time.Now()
	a.healthMu.Lock()
	defer a.healthMu.Unlock()
	if !a.polling {
		return nil
	}
	out := make(map[string]error, len(a.cfg.Nodes))
	for _, n := range a.cfg.Nodes {
		_, _, out[n] = a.stateLocked(n, mono)
	}
	return out
}

// Events implements hypervisors.EventSource: node up/down and every
// change the poller sees in this installation's VMs, coalesced per VM.
func (a *Adapter) Events() <-chan hypervisors.Event { return a.events.C() }

// diff compares a listing's VMs of this installation with the previous
// poll's and pushes one EventVM per VM that appeared, vanished or changed.
// The first listing is the baseline and pushes nothing. A VM on a node
// the cluster does not list online keeps its previous state (PVE shows
// it "unknown"): its node's EventZoneDown covers it. Only the poller
// goroutine calls diff.
func (a *Adapter) diff(l *listing) {
	next := a.spare
	clear(next)
	var evs []hypervisors.Event
	push := func(st vmState, vmid int, detail string) {
		if st.machine == "" {
			st.machine = a.machineOf(vmid)
		}
		evs = append(evs, hypervisors.Event{Zone: st.node, Kind: hypervisors.EventVM, VM: st.name, MachineID: st.machine, Detail: detail})
	}
	var disowned map[int]bool
	for i := range l.vms {
		r := &l.vms[i]
		if r.Template == 1 {
			continue
		}
		id := int(r.VMID)
		prev, had := a.snap[id]
		// The snapshot holds only our VMs: unchanged tags keep a VM ours
		// without parsing them again.
		ours := had && prev.tags == r.Tags || pvemarker.HasOwnershipTags(tagList(r.Tags), a.cfg.Installation)
		if !ours && !had {
			continue
		}
		if had && l.nodes[r.Node] != nodeOnline {
			next[id] = prev
			continue
		}
		// st.machine is prev's, so st == prev compares the listing alone.
		st := vmState{node: r.Node, name: r.Name, status: r.Status, tags: r.Tags, pool: r.Pool,
			maxMem: r.MaxMem, maxCPU: r.MaxCPU, machine: prev.machine}
		if !ours {
			if disowned == nil {
				disowned = map[int]bool{}
			}
			disowned[id] = true
			if a.baseline {
				push(prev, id, "disowned")
			}
			continue
		}
		same := had && st == prev
		if st.machine == "" {
			st.machine = a.machineOf(id)
		}
		next[id] = st
		switch {
		case !a.baseline || same:
		case !had:
			push(st, id, "defined")
		case st.node != prev.node:
			push(prev, id, "migrated")
			push(st, id, "migrated")
		case st.status != prev.status:
			push(st, id, powerWord(st.status))
		default:
			push(st, id, "changed")
		}
	}
	if a.baseline {
		for id, prev := range a.snap {
			if _, ok := next[id]; !ok && !disowned[id] {
				push(prev, id, "undefined")
			}
		}
	}
	a.spare, a.snap = a.snap, next
	a.baseline = true
	for _, ev := range evs {
		a.events.Push(ev)
	}
}

// powerWord names a VM's new listing status for an event.
func powerWord(status string) string {
	switch status {
	case "running":
		return "started"
	case "stopped":
		return "stopped"
	}
	return "changed"
}

// machineOf returns the machine id the adapter knows for a VM: from the
// marker of its cached config, else from the clone or marker write that
// made it ours ("" if neither).
func (a *Adapter) machineOf(vmid int) string {
	a.cacheMu.Lock()
	defer a.cacheMu.Unlock()
	if e := a.configs[vmid]; e != nil && e.marker != nil {
		return e.marker.MachineID
	}
	return a.owners[vmid].machine
}

// ownerNote records that this adapter made a VM the VM of a machine.
type ownerNote struct {
	machine string
	at      time.Time // Config.Now when noted
}

// noteOwner records that this adapter made vmid the VM of machineID.
func (a *Adapter) noteOwner(vmid int, machineID string) {
	a.cacheMu.Lock()
	a.owners[vmid] = ownerNote{machine: machineID, at: a.cfg.Now()}
	a.cacheMu.Unlock()
}
