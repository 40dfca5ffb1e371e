package libvirt

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/bigfleet-vm/provider/hypervisors"
)

// newFakeZone is an adapter with one zone "z" on d, probing fast. Its
// calls never time out by themselves unless callTimeout says so: only the
// liveness machinery can end them.
func newFakeZone(t *testing.T, d *fakeDaemon, callTimeout time.Duration, maxInFlight int) *Hypervisor {
	t.Helper()
	return newFakeZoneLost(t, d, callTimeout, maxInFlight, 0)
}

// newFakeZoneLost is newFakeZone with LostAfter (0: the default).
func newFakeZoneLost(t *testing.T, d *fakeDaemon, callTimeout time.Duration, maxInFlight int, lostAfter time.Duration) *Hypervisor {
	t.Helper()
	if callTimeout == 0 {
		callTimeout = time.Hour
	}
	h, err := New(Config{Installation: "i", Zones: []ZoneURI{{Zone: "z", URI: d.uri()}},
		CallTimeout: callTimeout, MaxInFlight: maxInFlight, LostAfter: lostAfter, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
		ProbeEvery: 50 * time.Millisecond, ProbeTimeout: 200 * time.Millisecond, DeadAfter: 500 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.WaitConnected(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "zone up", func() bool { return h.ZoneHealth()["z"] == nil })
	return h
}

// waitFor polls cond for at most 10 s (a bound on a hang, not a timing).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached in 10s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// lookupAsync starts a Lookup and returns where its error arrives.
func lookupAsync(h *Hypervisor) <-chan error {
	out := make(chan error, 1)
	go func() {
		_, err := h.Lookup(context.Background(), hypervisors.Target{Zone: "z", Name: "bf-x"})
		out <- err
	}()
	return out
}

// A connection that stops answering (the daemon is fine: a wedged client
// connection, as go-libvirt's misrouted stream reply leaves it) is closed
// and redialled, and the call waiting on it returns with a retryable
// ErrUnreachable instead of waiting out its own deadline (an hour here).
// The stall seen in TestTransportsUnderLoad: a guest-exec in flight on the
// wedged connection waited its full 60 s bound after the probe had already
// dropped the connection.
func TestWedgedConnectionReleasesCallsAndRedials(t *testing.T) {
	d := newFakeDaemon(t)
	d.setHold(procDomainLookup, true)
	h := newFakeZone(t, d, 0, 0)
	res := lookupAsync(h)
	waitFor(t, "the lookup reaches the daemon", func() bool { _, _, held, _ := d.stats(procDomainLookup); return held == 1 })
	d.silenceConn(1)
	select {
	case err := <-res:
		if !errors.Is(err, hypervisors.ErrUnreachable) || !hypervisors.Retryable(err) {
			t.Fatalf("lookup on the wedged connection: %v, want a retryable ErrUnreachable", err)
		}
		if !strings.Contains(err.Error(), "liveness probe") {
			t.Errorf("error %q does not say why the connection was dropped", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the call on the wedged connection is still waiting")
	}
	waitFor(t, "the wedged connection closed and a new one dialled", func() bool {
		acc, closed, _, _ := d.stats(0)
		return closed >= 1 && acc >= 2
	})
	d.setHold(procDomainLookup, false)
	waitFor(t, "zone up again", func() bool { return h.ZoneHealth()["z"] == nil })
	if _, err := h.Lookup(context.Background(), hypervisors.Target{Zone: "z", Name: "bf-x"}); !errors.Is(err, hypervisors.ErrNotFound) {
		t.Errorf("lookup on the new connection: %v, want the daemon's not-found", err)
	}
}

// slowFailingWriter fails its first write, late enough for go-libvirt's
// reader to be blocked handing over the next packet.
type slowFailingWriter struct{}

func (slowFailingWriter) Write([]byte) (int, error) {
	time.Sleep(100 * time.Millisecond)
	return 0, io.ErrShortWrite
}

// A call the daemon is slow to answer, on a connection that answers its
// probes, fails with a retryable error at its deadline; the connection is
// kept (no redial, the zone stays up) and serves the next call.
func TestSlowCallKeepsALiveConnection(t *testing.T) {
	d := newFakeDaemon(t)
	d.setHold(procDomainLookup, true)
	h := newFakeZone(t, d, 300*time.Millisecond, 0)
	err := <-lookupAsync(h)
	if !errors.Is(err, hypervisors.ErrTransient) || !strings.Contains(err.Error(), "no answer within 300ms") {
		t.Fatalf("slow lookup: %v, want ErrTransient: no answer within 300ms", err)
	}
	// The timed-out call had the connection probed at once; it answered.
	probes := h.Probes()
	waitFor(t, "two more probes", func() bool { return h.Probes() >= probes+2 })
	if acc, closed, _, _ := d.stats(0); acc != 1 || closed != 0 {
		t.Errorf("connections accepted %d, closed %d; want the one connection kept", acc, closed)
	}
	if err := h.ZoneHealth()["z"]; err != nil {
		t.Errorf("zone health %v, want up", err)
	}
	d.setHold(procDomainLookup, false)
	if _, err := h.Lookup(context.Background(), hypervisors.Target{Zone: "z", Name: "bf-x"}); !errors.Is(err, hypervisors.ErrNotFound) {
		t.Errorf("next lookup: %v, want the daemon's not-found", err)
	}
}

// Calls given up on keep their request slot until the daemon answers; once
// every slot is held by calls unanswered for LostAfter (their answers are
// lost) the connection is recycled, so slots do not stay taken for good.
func TestLostCallsRecycleTheConnection(t *testing.T) {
	d := newFakeDaemon(t)
	d.setHold(procDomainLookup, true)
	h := newFakeZoneLost(t, d, 100*time.Millisecond, 2, 300*time.Millisecond)
	for i := 0; i < 2; i++ {
		if err := <-lookupAsync(h); !errors.Is(err, hypervisors.ErrTransient) {
			t.Fatalf("lookup %d: %v, want ErrTransient", i, err)
		}
	}
	waitFor(t, "the connection recycled", func() bool {
		acc, closed, _, _ := d.stats(0)
		return closed >= 1 && acc >= 2
	})
}

// A daemon that hangs up right after answering connect-open, the last
// call of the handshake. go-libvirt's ConnectToURI sets the channel
// Disconnected returns after that answer, while the goroutine it started
// to watch the socket may already be reading it: the transport holds back
// the end of the stream until the handshake has returned, so the two are
// ordered (under -race this was "race detected", seen in CI when
// TestLostCallsRecycleTheConnection ended during a redial). The zone sees
// each connection go through Disconnected (no probe runs here) and
// redials.
func TestHangUpAfterHandshake(t *testing.T) {
	d := newFakeDaemon(t)
	d.hangUpAfter(procConnectOpen)
	h, err := New(Config{Installation: "i", Zones: []ZoneURI{{Zone: "z", URI: d.uri()}}, CallTimeout: time.Hour,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
		ProbeEvery: time.Hour, ProbeTimeout: time.Hour, DeadAfter: time.Hour}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	waitFor(t, "three connections dropped", func() bool {
		acc, closed, _, _ := d.stats(0)
		return acc >= 4 && closed >= 3
	})
}

// A daemon that hangs up while the handshake waits for its answer: the
// stream's end is held back for the handshake (see
// TestHangUpAfterHandshake) for a bounded time only, since here it is what
// releases the handshake. The dial fails with the daemon's hang-up well
// before its own timeout (an hour here).
func TestHangUpDuringHandshake(t *testing.T) {
	d := newFakeDaemon(t)
	d.answer(procAuthList, func(int) (uint32, []byte, bool) { return 0, nil, false })
	d.hangUpAfter(procAuthList)
	h, err := New(Config{Installation: "i", Zones: []ZoneURI{{Zone: "z", URI: d.uri()}}, CallTimeout: time.Hour,
		DialTimeout: time.Hour, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
		ProbeEvery: time.Hour, ProbeTimeout: time.Hour, DeadAfter: time.Hour}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	waitFor(t, "the dial failed and was retried", func() bool {
		acc, closed, _, _ := d.stats(0)
		return acc >= 2 && closed >= 1
	})
	if err := h.ZoneHealth()["z"]; err == nil || !strings.Contains(err.Error(), "handshake") {
		t.Errorf("zone health %v, want the handshake's failure", err)
	}
}

// Calls that outlive their deadline on a live daemon (eight domains
// starting at once on a loaded host: each start takes longer than the
// deadline, every slot is taken by one) do not cost the connection: when
// the daemon answers them, the slots free up and the next call goes
// through on the same connection. (TestParallelCreates8 failed when every
// slot held by a late call recycled the connection at once: the calls in
// flight failed with it.)
func TestLateCallsKeepTheConnection(t *testing.T) {
	d := newFakeDaemon(t)
	d.setHold(procDomainLookup, true)
	h := newFakeZone(t, d, 100*time.Millisecond, 2)
	for i := 0; i < 2; i++ {
		if err := <-lookupAsync(h); !errors.Is(err, hypervisors.ErrTransient) {
			t.Fatalf("lookup %d: %v, want ErrTransient", i, err)
		}
	}
	probes := h.Probes()
	waitFor(t, "more probes", func() bool { return h.Probes() >= probes+5 })
	d.setHold(procDomainLookup, false)
	waitFor(t, "a lookup on the freed slots", func() bool {
		_, err := h.Lookup(context.Background(), hypervisors.Target{Zone: "z", Name: "bf-x"})
		return errors.Is(err, hypervisors.ErrNotFound)
	})
	if acc, closed, _, _ := d.stats(0); acc != 1 || closed != 0 {
		t.Errorf("connections accepted %d, closed %d; want the one connection kept", acc, closed)
	}
}

// At most MaxInFlight calls are on the wire at once; the others wait for a
// slot, and the liveness probe, which takes none, keeps the zone up.
func TestRequestSlotsLeaveRoomForTheProbe(t *testing.T) {
	d := newFakeDaemon(t)
	d.setHold(procDomainLookup, true)
	h := newFakeZone(t, d, 0, 2)
	var results []<-chan error
	for i := 0; i < 5; i++ {
		results = append(results, lookupAsync(h))
	}
	waitFor(t, "two lookups held", func() bool { _, _, held, _ := d.stats(procDomainLookup); return held == 2 })
	probes := h.Probes()
	waitFor(t, "probes answered meanwhile", func() bool { return h.Probes() >= probes+3 })
	if err := h.ZoneHealth()["z"]; err != nil {
		t.Errorf("zone health with every slot taken: %v, want up", err)
	}
	d.setHold(procDomainLookup, false)
	for _, r := range results {
		if err := <-r; !errors.Is(err, hypervisors.ErrNotFound) {
			t.Errorf("lookup: %v, want not found", err)
		}
	}
	if _, _, held, calls := d.stats(procDomainLookup); held != 2 || calls != 5 {
		t.Errorf("at most %d lookups on the wire at once (want 2), %d in all (want 5)", held, calls)
	}
}

// A daemon that never answers the event subscription does not keep the
// zone from coming up or its probe from running (the connection loop does
// not wait for it).
func TestHungSubscriptionDoesNotHoldTheZone(t *testing.T) {
	d := newFakeDaemon(t)
	d.setHold(procEventRegisterAny, true)
	h, err := New(Config{Installation: "i", Zones: []ZoneURI{{Zone: "z", URI: d.uri()}}, CallTimeout: time.Hour,
		ProbeEvery: 50 * time.Millisecond, ProbeTimeout: time.Second, DeadAfter: 2 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	up := false
	deadline := time.After(10 * time.Second)
	for !up {
		select {
		case ev := <-h.Events():
			up = ev.Kind == hypervisors.EventZoneUp
		case <-deadline:
			t.Fatal("no zone-up event while the subscription hangs")
		}
	}
	waitFor(t, "probes running", func() bool { return h.Probes() >= 2 })
}

// Every RPC is reported with its zone and procedure, and so is the probe
// (procedure ""); a call given up on is reported with an error.
func TestRPCsAreReported(t *testing.T) {
	d := newFakeDaemon(t)
	h := newFakeZone(t, d, 300*time.Millisecond, 0)
	var mu sync.Mutex
	seen := map[string]int{}
	failed := map[string]int{}
	h.ObserveRPCs(func(zone, proc string, _ time.Duration, err error) {
		mu.Lock()
		defer mu.Unlock()
		seen[zone+"/"+proc]++
		if err != nil {
			failed[zone+"/"+proc]++
		}
	})
	if _, err := h.Lookup(context.Background(), hypervisors.Target{Zone: "z", Name: "bf-x"}); !errors.Is(err, hypervisors.ErrNotFound) {
		t.Fatal(err)
	}
	d.setHold(procDomainLookup, true)
	<-lookupAsync(h)
	waitFor(t, "a probe reported", func() bool { mu.Lock(); defer mu.Unlock(); return seen["z/"] > 0 })
	mu.Lock()
	defer mu.Unlock()
	if seen["z/DomainLookupByName"] != 2 || failed["z/DomainLookupByName"] != 2 {
		t.Errorf("lookups reported %d (%d failed), want 2 (2 failed: not found, then no answer); all: %v", seen["z/DomainLookupByName"], failed["z/DomainLookupByName"], seen)
	}
}

// go-libvirt's reader hands each packet to its call while holding the
// callback lock, and a call that stops listening (it returned on an error,
// or on the end of a stream whose reply is still to come, as in
// TestGoLibvirtStreamDataBeforeReply) waits for that lock to deregister:
// the reader blocks for good, and every later call blocks before it is
// even sent. Here a download whose writer fails while more stream packets
// arrive wedges the client deterministically. The adapter no longer
// downloads, but whatever wedges go-libvirt, the probe declares the
// connection dead and every call stuck on it returns.
func TestWedgedClientReleasesCallsAndRedials(t *testing.T) {
	d := newFakeDaemon(t)
	h := newFakeZone(t, d, 0, 0)
	zc := h.zones["z"]
	dl := make(chan error, 1)
	go func() {
		dl <- zc.rpc(context.Background(), "StorageVolDownload", "download", 0, func(l *golibvirt.Libvirt) error {
			return l.StorageVolDownload(golibvirt.StorageVol{Pool: "p", Name: "v"}, slowFailingWriter{}, 0, 4096, 0)
		})
	}()
	waitFor(t, "the download answered", func() bool { _, _, _, n := d.stats(procVolDownload); return n == 1 })
	lookup := lookupAsync(h)
	for name, res := range map[string]<-chan error{"download": dl, "lookup": lookup} {
		select {
		case err := <-res:
			if !errors.Is(err, hypervisors.ErrUnreachable) || !strings.Contains(err.Error(), "liveness probe") {
				t.Errorf("%s on the wedged client: %v, want ErrUnreachable naming the probe", name, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s on the wedged client is still waiting", name)
		}
	}
	waitFor(t, "a new connection", func() bool { acc, _, _, _ := d.stats(0); return acc >= 2 })
	waitFor(t, "zone up again", func() bool { return h.ZoneHealth()["z"] == nil })
	if _, err := h.Lookup(context.Background(), hypervisors.Target{Zone: "z", Name: "bf-x"}); !errors.Is(err, hypervisors.ErrNotFound) {
		t.Errorf("lookup on the new connection: %v, want the daemon's not-found", err)
	}
}

// stateReply is DomainGetState's answer.
func stateReply(state golibvirt.DomainState, reason int32) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(state))
	return binary.BigEndian.AppendUint32(b, uint32(reason))
}

// A start whose call outlived its deadline leaves the domain paused while
// libvirtd is still starting it; the retried Start waits (retryable)
// instead of resuming, which would block on the start's job and then be
// refused.
func TestStartWaitsForAStartInProgress(t *testing.T) {
	d := newFakeDaemon(t)
	d.answer(procDomainLookup, func(int) (uint32, []byte, bool) { return 0, domainReply("bf-x", 3), true })
	d.answer(procDomainGetState, func(int) (uint32, []byte, bool) {
		return 0, stateReply(golibvirt.DomainPaused, int32(golibvirt.DomainPausedStartingUp)), true
	})
	h := newFakeZone(t, d, 0, 0)
	err := h.Start(context.Background(), hypervisors.Target{Zone: "z", Name: "bf-x"})
	if !hypervisors.Retryable(err) || !strings.Contains(err.Error(), "still starting") {
		t.Fatalf("Start on a domain libvirtd is starting: %v, want a retryable 'still starting'", err)
	}
	if _, _, _, n := d.stats(procDomainResume); n != 0 {
		t.Errorf("%d resumes sent to a domain still starting", n)
	}
}

// A resume refused as "already running" (raced with libvirtd's own start)
// is success when the domain is running, and retryable when its state
// cannot be read again (every slot taken by other slow starts, in
// TestParallelCreates8): never a failed machine.
func TestStartRefusalWithUnreadableStateIsRetryable(t *testing.T) {
	d := newFakeDaemon(t)
	d.answer(procDomainLookup, func(int) (uint32, []byte, bool) { return 0, domainReply("bf-x", 3), true })
	d.answer(procDomainResume, func(int) (uint32, []byte, bool) {
		return 1, libvirtError(uint32(golibvirt.ErrOperationInvalid), "Requested operation is not valid: domain is already running"), true
	})
	d.answer(procDomainGetState, func(n int) (uint32, []byte, bool) {
		// Paused by the user at first; the second read goes unanswered.
		return 0, stateReply(golibvirt.DomainPaused, int32(golibvirt.DomainPausedUser)), n == 1
	})
	h := newFakeZone(t, d, 300*time.Millisecond, 0)
	err := h.Start(context.Background(), hypervisors.Target{Zone: "z", Name: "bf-x"})
	if !hypervisors.Retryable(err) {
		t.Fatalf("Start refused, state unreadable: %v, want retryable", err)
	}
	d.answer(procDomainGetState, func(n int) (uint32, []byte, bool) {
		if n%2 == 1 {
			return 0, stateReply(golibvirt.DomainPaused, int32(golibvirt.DomainPausedUser)), true
		}
		return 0, stateReply(golibvirt.DomainRunning, 1), true
	})
	if err := h.Start(context.Background(), hypervisors.Target{Zone: "z", Name: "bf-x"}); err != nil {
		t.Errorf("Start refused as already running, then running: %v, want success", err)
	}
}

// A connection closes at once when no registration was sent, waits for
// one that was, and waits no longer than its bound for one never
// answered; nothing is sent once closing began.
func TestSubscriptionSettle(t *testing.T) {
	s := newSubscription()
	if !s.settle(time.Hour) {
		t.Error("settle with nothing sent reported a registration unanswered")
	}
	if s.begin() {
		t.Error("a registration may be sent after the connection began closing")
	}

	s = newSubscription()
	if !s.begin() {
		t.Fatal("begin refused on an open connection")
	}
	go func() { time.Sleep(20 * time.Millisecond); s.end() }()
	if !s.settle(time.Minute) {
		t.Error("settle gave up on a registration answered in 20ms")
	}

	s = newSubscription()
	s.begin()
	done := make(chan bool, 1)
	go func() { done <- s.settle(50 * time.Millisecond) }()
	select {
	case ok := <-done:
		if ok {
			t.Error("settle reported an unanswered registration as answered")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("settle waited past its bound for a registration never answered")
	}
}
