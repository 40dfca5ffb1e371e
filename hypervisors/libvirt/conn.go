package libvirt

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/retry"
)

// zoneConn owns the connection to one zone. The background loop (run)
// is the only code that dials or replaces lv; calls read it under mu.
//
// Its status is always one of: connecting (no dial has finished yet), up
// (connected and answering), or down (with the reason and since when).
// "Up" is withdrawn as soon as the socket closes, and also while the
// liveness probe has gone unanswered for longer than ProbeTimeout; a
// connection whose probe stays unanswered for DeadAfter is closed and
// redialled, and every call in flight on it returns at once with an error
// wrapping ErrUnreachable.
//
// Every RPC goes through rpc: it waits for one of MaxInFlight request
// slots (libvirtd serves at most max_client_requests, default 5, calls of
// one client at a time and stops reading the socket beyond that; the probe
// never takes a slot, so it always reaches the daemon), runs under a
// deadline, and on expiry returns a retryable error at once and has the
// connection probed straight away. A call that outlives its deadline keeps
// its slot until the daemon answers or the connection closes (so at most
// MaxInFlight goroutines per connection wait on calls given up on); when
// every slot is held by calls unanswered for LostAfter, their answers are
// lost and the connection is recycled.
type zoneConn struct {
	zone   string
	uri    *url.URL
	cfg    *Config
	log    *slog.Logger
	calls  *atomic.Int64
	probes *atomic.Int64
	dialFn func(ctx context.Context, u *url.URL) (*golibvirt.Libvirt, io.Closer, error)
	// events receives zone-up/zone-down and domain lifecycle events; nil
	// disables them.
	events *hypervisors.EventQueue
	// owner maps a domain name to the machine id the adapter knows owns it.
	owner func(name string) string
	// changed is told the name of every domain an event reports, so the
	// next Observe re-reads its definition (an out-of-band edit changes
	// neither id nor state).
	changed func(name string)
	// observe, when set, is told how long every RPC (procedure "" for the
	// liveness probe) took and how it ended.
	observe func(zone, procedure string, d time.Duration, err error)

	mu        sync.Mutex
	lv        *golibvirt.Libvirt
	lastErr   error         // why the zone is not up (nil when up)
	downSince time.Time     // when it stopped being up
	stalled   time.Time     // non-zero: the current probe has been pending since
	gen       uint64        // bumped on every new connection
	broken    chan struct{} // closed to ask run to drop the connection
	why       error         // why broken was closed
	// cs is the current connection's call state (nil in unit tests that
	// set lv by hand: no slots, nothing to wait for).
	cs    *connState
	ready chan struct{} // closed when the first dial attempt has finished
	once  sync.Once
}

// connState is what the calls on one connection share.
type connState struct {
	dead     chan struct{} // closed once the connection is dropped
	why      error         // why dead was closed (set before)
	slots    chan struct{} // request slots
	probeNow chan struct{} // asks the probe to probe at once

	mu sync.Mutex
	// given holds the calls given up on whose RPC is still pending, by
	// call number, with when they were given up.
	given map[uint64]time.Time
	next  uint64
}

func newConnState(slots int) *connState {
	return &connState{dead: make(chan struct{}), slots: make(chan struct{}, slots), probeNow: make(chan struct{}, 1), given: map[uint64]time.Time{}}
}

func (c *connState) number() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.next++
	return c.next
}

func (c *connState) giveUp(n uint64, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.given[n] = at
}

func (c *connState) answered(n uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.given, n)
}

// lost counts the calls given up on before t and still unanswered.
func (c *connState) lost(t time.Time) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, at := range c.given {
		if at.Before(t) {
			n++
		}
	}
	return n
}

// deadErr is what a call on a dropped connection returns.
func (c *connState) deadErr(op string) error {
	why := c.why
	if why == nil {
		why = errors.New("connection dropped")
	}
	return fmt.Errorf("%s: %w: connection dropped while the call was in flight: %w", op, hypervisors.ErrUnreachable, why)
}

func newZoneConn(zone string, u *url.URL, cfg *Config, log *slog.Logger, calls, probes *atomic.Int64) *zoneConn {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &zoneConn{
		zone: zone, uri: u, cfg: cfg, log: log, calls: calls, probes: probes,
		dialFn:  connect,
		lastErr: errors.New("connecting: first dial in progress"),
		broken:  make(chan struct{}),
		ready:   make(chan struct{}),
		owner:   func(string) string { return "" },
		changed: func(string) {},
	}
}

// newBackoff is the reconnect policy (retry.Reconnect, with the bounds the
// config may override): jittered exponential, capped low, reset after
// every successful dial.
func newBackoff(cfg *Config) *retry.Backoff {
	p := retry.Reconnect
	p.Initial, p.Max = cfg.MinBackoff, cfg.MaxBackoff
	return p.Backoff()
}

func (z *zoneConn) emit(ev hypervisors.Event) {
	if z.events != nil {
		ev.Zone = z.zone
		z.events.Push(ev)
	}
}

// run keeps the zone connected until ctx ends, redialling with backoff.
func (z *zoneConn) run(ctx context.Context) {
	bo := newBackoff(z.cfg)
	for {
		lv, tr, err := z.dial(ctx)
		if err != nil {
			z.setDown(err, false)
			// ready promises the first dial's outcome is visible.
			z.once.Do(func() { close(z.ready) })
			wait := bo.Next()
			z.log.Warn("libvirt dial failed", "zone", z.zone, "err", err, "retry_in", wait)
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			continue
		}
		bo.Reset()
		connCtx, cancel := context.WithCancel(ctx)
		cs := newConnState(z.cfg.MaxInFlight)
		z.mu.Lock()
		z.lv, z.lastErr, z.stalled = lv, nil, time.Time{}
		z.gen++
		gen := z.gen
		broken := make(chan struct{})
		z.broken, z.why = broken, nil
		z.cs = cs
		z.mu.Unlock()
		z.once.Do(func() { close(z.ready) })
		z.log.Info("libvirt connected", "zone", z.zone)
		// Neither waits here: the loop must see the connection break
		// while either is under way.
		sub := newSubscription()
		go z.probe(connCtx, lv, gen, cs)
		go z.subscribe(connCtx, sub)
		z.emit(hypervisors.Event{Kind: hypervisors.EventZoneUp})

		var why error
		select {
		case <-ctx.Done():
			why = errors.New("closed")
		case <-lv.Disconnected():
			why = errors.New("connection lost")
		case <-broken:
			z.mu.Lock()
			why = z.why
			z.mu.Unlock()
		}
		cancel()
		z.setDown(why, true)
		cs.why = why
		close(cs.dead)
		// Never close under a registration libvirtd may still be
		// dispatching: see subscription.
		if !sub.settle(z.cfg.ProbeTimeout) {
			z.log.Warn("libvirt event subscription unanswered; closing anyway", "zone", z.zone, "waited", z.cfg.ProbeTimeout)
		}
		// Close the transport itself: go-libvirt's Disconnect sends a
		// close RPC first, which a wedged daemon or connection never
		// answers. Closing it ends go-libvirt's reader, which releases
		// every call still waiting on this connection.
		_ = tr.Close()
		if ctx.Err() != nil {
			return
		}
		z.log.Warn("libvirt connection dropped", "zone", z.zone, "err", why)
		z.emit(hypervisors.Event{Kind: hypervisors.EventZoneDown, Detail: why.Error()})
		// A dropped connection is redialled at once; only failed dials
		// back off.
	}
}

// setDown records why the zone is not up. dropped says a live connection
// just went away (the down time starts now); a failed dial keeps the
// earlier down time.
func (z *zoneConn) setDown(why error, dropped bool) {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.lv = nil
	if dropped || z.downSince.IsZero() {
		z.downSince = time.Now()
	}
	z.lastErr = fmt.Errorf("down since %s: %w", z.downSince.UTC().Format(time.RFC3339), why)
}

// probe asks the daemon for its version every ProbeEvery, and at once when
// a call gave up (probeNow). A probe pending longer than ProbeTimeout
// makes the zone report down (without dropping work in flight); one
// pending for DeadAfter, or one that fails without a libvirt error (the
// socket is gone), drops the connection, and so do request slots all held
// by calls unanswered for LostAfter. The probe takes no request slot.
func (z *zoneConn) probe(ctx context.Context, lv *golibvirt.Libvirt, gen uint64, cs *connState) {
	t := time.NewTicker(z.cfg.ProbeEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-cs.probeNow:
		}
		if n := cs.lost(time.Now().Add(-z.cfg.LostAfter)); n >= cap(cs.slots) {
			z.markBroken(gen, fmt.Errorf("all %d request slots held by calls unanswered for over %s (their answers are lost)", n, z.cfg.LostAfter))
			return
		}
		z.probes.Add(1)
		done := make(chan error, 1)
		start := time.Now()
		go func() { _, err := lv.ConnectGetLibVersion(); done <- err }()
		answered := func(err error) bool {
			z.record("", time.Since(start), err)
			var le golibvirt.Error
			if err != nil && !errors.As(err, &le) {
				z.markBroken(gen, fmt.Errorf("liveness probe failed: %w", err))
				return false
			}
			return true
		}
		select {
		case err := <-done:
			if !answered(err) {
				return
			}
			continue
		case <-ctx.Done():
			return
		case <-time.After(z.cfg.ProbeTimeout):
		}
		z.mu.Lock()
		if z.gen == gen {
			z.stalled = start
		}
		z.mu.Unlock()
		z.log.Warn("libvirt daemon not answering", "zone", z.zone, "waited", z.cfg.ProbeTimeout)
		z.emit(hypervisors.Event{Kind: hypervisors.EventZoneDown, Detail: "not answering"})
		select {
		case err := <-done:
			if !answered(err) {
				return
			}
			z.mu.Lock()
			if z.gen == gen {
				z.stalled = time.Time{}
			}
			z.mu.Unlock()
			z.log.Info("libvirt daemon answering again", "zone", z.zone, "after", time.Since(start).Round(time.Millisecond))
			z.emit(hypervisors.Event{Kind: hypervisors.EventZoneUp})
		case <-ctx.Done():
			return
		case <-time.After(z.cfg.DeadAfter - z.cfg.ProbeTimeout):
			z.record("", time.Since(start), errNoAnswer)
			z.markBroken(gen, fmt.Errorf("no answer to the liveness probe within %s", z.cfg.DeadAfter))
			return
		}
	}
}

// errNoAnswer stands for a call given up on, for metrics and logs.
var errNoAnswer = errors.New("no answer")

// record reports one finished (or given up) RPC.
func (z *zoneConn) record(proc string, d time.Duration, err error) {
	if z.observe != nil {
		z.observe(z.zone, proc, d, err)
	}
}

// subscription keeps a connection from being closed while libvirtd may
// still be dispatching its event registration. libvirtd 9.0 frees a
// closing client's callback list without waiting for a
// ConnectDomainEventCallbackRegisterAny (or ...DeregisterAny) it is
// dispatching for that client on another thread, and dies of it ("unexpected
// incomplete domain callback", then a segfault in
// remoteClientFreePrivateCallbacks). So the registration is sent only while
// the connection is not closing, the connection closes only once it was
// answered (or after a bound, for a daemon that no longer answers at all),
// and the subscription is never deregistered by hand: closing the
// connection ends it, in libvirtd and in go-libvirt, in one step.
type subscription struct {
	mu       sync.Mutex
	closing  bool
	sent     bool
	answered chan struct{}
}

func newSubscription() *subscription { return &subscription{answered: make(chan struct{})} }

// begin reports whether the registration may be sent; after a true, end
// must follow once it is answered.
func (s *subscription) begin() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sent = !s.closing
	return s.sent
}

func (s *subscription) end() { close(s.answered) }

// settle stops any registration from being sent and waits up to bound for
// one already sent to be answered; it reports whether nothing is left
// unanswered.
func (s *subscription) settle(bound time.Duration) bool {
	s.mu.Lock()
	s.closing = true
	sent := s.sent
	s.mu.Unlock()
	if !sent {
		return true
	}
	t := time.NewTimer(bound)
	defer t.Stop()
	select {
	case <-s.answered:
		return true
	case <-t.C:
		return false
	}
}

// subscribe forwards the connection's domain lifecycle events until the
// connection closes. The subscription is one RPC, bounded like any other;
// a failed one is logged: the periodic pass still sees every change, only
// later.
func (z *zoneConn) subscribe(ctx context.Context, sub *subscription) {
	if z.events == nil {
		return
	}
	err := z.rpc(ctx, "ConnectDomainEventCallbackRegisterAny", "subscribe to lifecycle events on "+z.zone, 0, func(l *golibvirt.Libvirt) error {
		if !sub.begin() {
			return errors.New("connection closing")
		}
		// Not ctx: go-libvirt deregisters when its context ends, and
		// that RPC would race the close (see subscription). Its stream
		// and this goroutine end when the connection closes.
		ch, err := l.LifecycleEvents(context.WithoutCancel(ctx))
		sub.end()
		if err != nil {
			return err
		}
		// Consumed whether or not rpc still waits: go-libvirt blocks
		// its forwarding goroutine on an unread channel.
		go func() {
			for ev := range ch {
				name := ev.Dom.Name
				z.changed(name)
				z.emit(hypervisors.Event{Kind: hypervisors.EventVM, VM: name, MachineID: z.owner(name),
					Detail: lifecycleWord(golibvirt.DomainEventType(ev.Event))})
			}
		}()
		return nil
	})
	if err != nil && ctx.Err() == nil {
		z.log.Warn("libvirt lifecycle events unavailable; drift is seen at the periodic pass", "zone", z.zone, "err", err)
	}
}

// lifecycleWord names a lifecycle event type.
func lifecycleWord(t golibvirt.DomainEventType) string {
	switch t {
	case golibvirt.DomainEventDefined:
		return "defined"
	case golibvirt.DomainEventUndefined:
		return "undefined"
	case golibvirt.DomainEventStarted:
		return "started"
	case golibvirt.DomainEventSuspended:
		return "suspended"
	case golibvirt.DomainEventResumed:
		return "resumed"
	case golibvirt.DomainEventStopped:
		return "stopped"
	case golibvirt.DomainEventShutdown:
		return "shutdown"
	case golibvirt.DomainEventPmsuspended:
		return "pmsuspended"
	case golibvirt.DomainEventCrashed:
		return "crashed"
	}
	return "changed"
}

// dial connects once, bounded by DialTimeout (every step of it: transport,
// TLS or SSH handshake, libvirt's own handshake).
func (z *zoneConn) dial(ctx context.Context) (*golibvirt.Libvirt, io.Closer, error) {
	dctx, cancel := context.WithTimeout(ctx, z.cfg.DialTimeout)
	defer cancel()
	lv, tr, err := z.dialFn(dctx, z.uri)
	if err != nil {
		if dctx.Err() != nil && ctx.Err() == nil {
			return nil, nil, fmt.Errorf("dial %s: timed out after %s: %w", hypervisors.RedactURL(z.uri.String()), z.cfg.DialTimeout, err)
		}
		return nil, nil, dialError(z.uri, err)
	}
	return lv, tr, nil
}

// health is nil when up, else why not (wrapping ErrUnreachable). It never
// names the zone: callers that show it do.
func (z *zoneConn) health() error {
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.lv != nil {
		if z.stalled.IsZero() {
			return nil
		}
		return fmt.Errorf("%w: daemon not answering for %s", hypervisors.ErrUnreachable, time.Since(z.stalled).Round(100*time.Millisecond))
	}
	return fmt.Errorf("%w: %w", hypervisors.ErrUnreachable, z.lastErr)
}

// connRef is one connection as a call sees it.
type connRef struct {
	lv  *golibvirt.Libvirt
	gen uint64
	cs  *connState // nil: a connection set up by hand in a unit test
}

// current returns the live connection, or an error wrapping ErrUnreachable
// that names the zone.
func (z *zoneConn) current() (connRef, error) {
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.lv == nil {
		return connRef{}, fmt.Errorf("zone %s: %w: %w", z.zone, hypervisors.ErrUnreachable, z.lastErr)
	}
	return connRef{lv: z.lv, gen: z.gen, cs: z.cs}, nil
}

// markBroken asks run to drop connection generation gen, saying why.
func (z *zoneConn) markBroken(gen uint64, why error) {
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.gen == gen && z.lv != nil {
		select {
		case <-z.broken:
		default:
			z.why = why
			close(z.broken)
		}
	}
}

// call runs one guest-agent command (QEMUDomainAgentCommand) through rpc;
// see rpc for timeout.
func (z *zoneConn) call(ctx context.Context, op string, timeout time.Duration, fn func(*golibvirt.Libvirt) error) error {
	return z.rpc(ctx, "QEMUDomainAgentCommand", op, timeout, fn)
}

// overrun is how far past its deadline a call may return before the
// adapter logs it as an overrun.
const overrun = time.Second

// Outcomes of one RPC goroutine, decided once.
const (
	rpcRunning int32 = iota
	rpcFinished
	rpcAbandoned
)

// rpc runs fn, which makes one libvirt RPC named proc; see rpcValue.
func (z *zoneConn) rpc(ctx context.Context, proc, op string, timeout time.Duration, fn func(*golibvirt.Libvirt) error) error {
	_, err := rpcValue(ctx, z, proc, op, timeout, func(l *golibvirt.Libvirt) (struct{}, error) { return struct{}{}, fn(l) })
	return err
}

// answer is what one RPC goroutine hands back.
type answer[T any] struct {
	v   T
	err error
}

// rpcValue runs fn, which makes one libvirt RPC named proc, against the
// zone's client with a deadline: the earlier of ctx's and CallTimeout (or
// timeout, if positive), covering the wait for a request slot too.
// go-libvirt calls take no context, so fn runs in a goroutine that is
// abandoned when the caller stops waiting: at the deadline or ctx's end
// (ErrTransient), or when the connection is dropped (ErrUnreachable). An
// abandoned call has the connection probed at once. fn's result travels
// back through a channel, so an abandoned fn never writes what its caller
// reads.
func rpcValue[T any](ctx context.Context, z *zoneConn, proc, op string, timeout time.Duration, fn func(*golibvirt.Libvirt) (T, error)) (T, error) {
	var zero T
	c, err := z.current()
	if err != nil {
		return zero, err
	}
	if timeout <= 0 {
		timeout = z.cfg.CallTimeout
	}
	start := time.Now()
	t := time.NewTimer(timeout)
	defer t.Stop()
	// The wrapper itself must keep the bound: when it does not (the
	// process starved of CPU), say so; the soak fails on this line.
	defer func() {
		if el := time.Since(start); el > timeout+overrun {
			z.log.Error("libvirt call overran its deadline", "zone", z.zone, "procedure", proc, "waited", el.Round(time.Millisecond), "deadline", timeout)
		}
	}()
	// A connection set up by hand in a unit test has no call state.
	var dead <-chan struct{}
	if c.cs != nil {
		dead = c.cs.dead
		select {
		case c.cs.slots <- struct{}{}:
		case <-t.C:
			z.record(proc, time.Since(start), errNoAnswer)
			z.probeSoon(c)
			return zero, fmt.Errorf("%s: %w: no request slot free within %s (all %d taken by calls in flight on this connection)", op, hypervisors.ErrTransient, timeout, cap(c.cs.slots))
		case <-ctx.Done():
			return zero, fmt.Errorf("%s: %w: %w", op, hypervisors.ErrTransient, ctx.Err())
		case <-dead:
			return zero, c.cs.deadErr(op)
		}
	}
	z.calls.Add(1)
	var n uint64
	if c.cs != nil {
		n = c.cs.number()
	}
	var state atomic.Int32
	done := make(chan answer[T], 1)
	go func() {
		v, err := fn(c.lv)
		if c.cs != nil {
			<-c.cs.slots
			if !state.CompareAndSwap(rpcRunning, rpcFinished) {
				c.cs.answered(n)
			}
		}
		done <- answer[T]{v, err}
	}()
	var gaveUp error
	select {
	case a := <-done:
		return a.v, z.finished(c, proc, op, start, a.err)
	case <-t.C:
		gaveUp = fmt.Errorf("%s: %w: no answer within %s", op, hypervisors.ErrTransient, timeout)
	case <-ctx.Done():
		gaveUp = fmt.Errorf("%s: %w: %w", op, hypervisors.ErrTransient, ctx.Err())
	case <-dead:
		gaveUp = c.cs.deadErr(op)
	}
	if c.cs != nil {
		// Recorded before the swap: a goroutine that finds the call
		// abandoned always finds it recorded.
		c.cs.giveUp(n, time.Now())
	}
	if !state.CompareAndSwap(rpcRunning, rpcAbandoned) {
		// It finished while we gave up: the answer is there.
		if c.cs != nil {
			c.cs.answered(n)
		}
		a := <-done
		return a.v, z.finished(c, proc, op, start, a.err)
	}
	z.record(proc, time.Since(start), errNoAnswer)
	z.probeSoon(c)
	return zero, gaveUp
}

// finished classifies the answer of a call that completed.
func (z *zoneConn) finished(c connRef, proc, op string, start time.Time, err error) error {
	z.record(proc, time.Since(start), err)
	if err != nil && !c.lv.IsConnected() {
		if c.cs != nil {
			select {
			case <-c.cs.dead:
				return c.cs.deadErr(op)
			default:
			}
		}
		return fmt.Errorf("%s: %w: %w", op, hypervisors.ErrUnreachable, err)
	}
	return classify(op, err)
}

// probeSoon asks the connection's probe to run now. A connection set up by
// hand in a unit test has no probe: it is dropped instead.
func (z *zoneConn) probeSoon(c connRef) {
	if c.cs == nil {
		z.markBroken(c.gen, errors.New("call timed out"))
		return
	}
	select {
	case c.cs.probeNow <- struct{}{}:
	default:
	}
}

// classify maps a go-libvirt error onto the hypervisors error classes,
// keeping the original in the chain.
func classify(op string, err error) error {
	if err == nil {
		return nil
	}
	var le golibvirt.Error
	if !errors.As(err, &le) {
		return fmt.Errorf("%s: %w: %w", op, hypervisors.ErrTransient, err)
	}
	// qemu's and the storage backends' ENOMEM and ENOSPC reach us as
	// internal or system errors: named, and terminal, not transient.
	if r := hypervisors.ResourceOf(le.Message); r != "" {
		return fmt.Errorf("%s: %w", op, &hypervisors.ResourceError{Resource: r, Err: err})
	}
	class := classOf(le)
	if class == nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return fmt.Errorf("%s: %w: %w", op, class, err)
}

// classOf returns the error class of a libvirt error code, or nil.
func classOf(le golibvirt.Error) error {
	switch golibvirt.ErrorNumber(le.Code) {
	case golibvirt.ErrNoDomain, golibvirt.ErrNoStorageVol, golibvirt.ErrNoStoragePool,
		golibvirt.ErrNoNetwork, golibvirt.ErrNoDomainMetadata:
		return hypervisors.ErrNotFound
	case golibvirt.ErrDomExist, golibvirt.ErrStorageVolExist:
		return hypervisors.ErrExists
	case golibvirt.ErrOperationDenied, golibvirt.ErrAuthFailed, golibvirt.ErrAuthCancelled,
		golibvirt.ErrAccessDenied, golibvirt.ErrAuthUnavailable:
		return hypervisors.ErrPermission
	case golibvirt.ErrAgentUnresponsive:
		return hypervisors.ErrAgentNotReady
	case golibvirt.ErrOperationTimeout, golibvirt.ErrAgentCommandTimeout, golibvirt.ErrResourceBusy,
		golibvirt.ErrRPC, golibvirt.ErrSystemError:
		return hypervisors.ErrTransient
	case golibvirt.ErrNoSupport, golibvirt.ErrOperationUnsupported, golibvirt.ErrArgumentUnsupported:
		return hypervisors.ErrUnsupported
	case golibvirt.ErrInvalidArg, golibvirt.ErrXMLError, golibvirt.ErrXMLDetail,
		golibvirt.ErrConfigUnsupported, golibvirt.ErrOperationInvalid:
		return hypervisors.ErrInvalid
	}
	return nil
}

// isCode reports whether err carries a libvirt error with one of codes.
func isCode(err error, codes ...golibvirt.ErrorNumber) bool {
	var le golibvirt.Error
	if !errors.As(err, &le) {
		return false
	}
	for _, c := range codes {
		if golibvirt.ErrorNumber(le.Code) == c {
			return true
		}
	}
	return false
}
