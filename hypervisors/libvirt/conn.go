package libvirt

import (
	"context"
	"errors"
	"fmt"
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
// periodic probe has gone unanswered for longer than ProbeTimeout; a
// connection whose probe stays unanswered for DeadAfter is dropped and
// redialled.
type zoneConn struct {
	zone   string
	uri    *url.URL
	cfg    *Config
	log    *slog.Logger
	calls  *atomic.Int64
	probes *atomic.Int64
	dialFn func(u *url.URL) (*golibvirt.Libvirt, error)
	// events receives zone-up/zone-down and domain lifecycle events; nil
	// disables them.
	events *hypervisors.EventQueue
	// owner maps a domain name to the machine id the adapter knows owns it.
	owner func(name string) string
	// changed is told the name of every domain an event reports, so the
	// next Observe re-reads its definition (an out-of-band edit changes
	// neither id nor state).
	changed func(name string)

	mu        sync.Mutex
	lv        *golibvirt.Libvirt
	lastErr   error         // why the zone is not up (nil when up)
	downSince time.Time     // when it stopped being up
	stalled   time.Time     // non-zero: the current probe has been pending since
	gen       uint64        // bumped on every new connection
	broken    chan struct{} // closed to ask run to drop the connection
	ready     chan struct{} // closed when the first dial attempt has finished
	once      sync.Once
}

func newZoneConn(zone string, u *url.URL, cfg *Config, log *slog.Logger, calls, probes *atomic.Int64) *zoneConn {
	return &zoneConn{
		zone: zone, uri: u, cfg: cfg, log: log, calls: calls, probes: probes,
		dialFn:  golibvirt.ConnectToURI,
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
		lv, err := z.dial(ctx)
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
		z.mu.Lock()
		z.lv, z.lastErr, z.stalled = lv, nil, time.Time{}
		z.gen++
		gen := z.gen
		broken := make(chan struct{})
		z.broken = broken
		z.mu.Unlock()
		z.once.Do(func() { close(z.ready) })
		z.log.Info("libvirt connected", "zone", z.zone)
		z.subscribe(connCtx, lv)
		go z.probe(connCtx, lv, gen)
		z.emit(hypervisors.Event{Kind: hypervisors.EventZoneUp})

		var why error
		select {
		case <-ctx.Done():
			why = errors.New("closed")
		case <-lv.Disconnected():
			why = errors.New("connection lost")
		case <-broken:
			why = errors.New("no answer within the deadline")
		}
		cancel()
		z.setDown(why, true)
		// Disconnect sends a close RPC first, which can hang on a wedged
		// daemon: never wait for it here.
		go func() { _ = lv.Disconnect() }()
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

// probe asks the daemon for its version every ProbeEvery. A probe pending
// longer than ProbeTimeout makes the zone report down (without dropping
// work in flight); one pending for DeadAfter drops the connection.
func (z *zoneConn) probe(ctx context.Context, lv *golibvirt.Libvirt, gen uint64) {
	t := time.NewTicker(z.cfg.ProbeEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		z.probes.Add(1)
		done := make(chan error, 1)
		go func() { _, err := lv.ConnectGetLibVersion(); done <- err }()
		start := time.Now()
		select {
		case <-done:
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
		case <-done:
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
			z.markBroken(gen)
			return
		}
	}
}

// subscribe forwards the connection's domain lifecycle events until ctx
// ends. A failed subscription is logged: the periodic pass still sees
// every change, only later.
func (z *zoneConn) subscribe(ctx context.Context, lv *golibvirt.Libvirt) {
	if z.events == nil {
		return
	}
	z.calls.Add(1)
	ch, err := lv.LifecycleEvents(ctx)
	if err != nil {
		z.log.Warn("libvirt lifecycle events unavailable; drift is seen at the periodic pass", "zone", z.zone, "err", err)
		return
	}
	go func() {
		for ev := range ch {
			name := ev.Dom.Name
			z.changed(name)
			z.emit(hypervisors.Event{Kind: hypervisors.EventVM, VM: name, MachineID: z.owner(name),
				Detail: lifecycleWord(golibvirt.DomainEventType(ev.Event))})
		}
	}()
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

// dial connects once, bounded by DialTimeout. A connection that completes
// after the deadline is closed.
func (z *zoneConn) dial(ctx context.Context) (*golibvirt.Libvirt, error) {
	type res struct {
		lv  *golibvirt.Libvirt
		err error
	}
	ch := make(chan res, 1)
	go func() {
		lv, err := z.dialFn(z.uri)
		ch <- res{lv, err}
	}()
	t := time.NewTimer(z.cfg.DialTimeout)
	defer t.Stop()
	select {
	case r := <-ch:
		if r.err != nil {
			return nil, dialError(z.uri, r.err)
		}
		return r.lv, nil
	case <-t.C:
	case <-ctx.Done():
	}
	go func() {
		if r := <-ch; r.lv != nil {
			_ = r.lv.Disconnect()
		}
	}()
	return nil, fmt.Errorf("dial %s: timed out after %s", redactURI(z.uri.String()), z.cfg.DialTimeout)
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

// current returns the live client and its generation, or an error wrapping
// ErrUnreachable that names the zone.
func (z *zoneConn) current() (*golibvirt.Libvirt, uint64, error) {
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.lv == nil {
		return nil, 0, fmt.Errorf("zone %s: %w: %w", z.zone, hypervisors.ErrUnreachable, z.lastErr)
	}
	return z.lv, z.gen, nil
}

// markBroken asks run to drop connection generation gen.
func (z *zoneConn) markBroken(gen uint64) {
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.gen == gen && z.lv != nil {
		select {
		case <-z.broken:
		default:
			close(z.broken)
		}
	}
}

// call runs fn against the zone's client with a deadline: the earlier of
// ctx's and CallTimeout (or timeout, if positive). go-libvirt calls take no
// context, so fn runs in a goroutine that is abandoned on expiry; expiry of
// the adapter's own deadline marks the connection broken.
func (z *zoneConn) call(ctx context.Context, op string, timeout time.Duration, fn func(*golibvirt.Libvirt) error) error {
	lv, gen, err := z.current()
	if err != nil {
		return err
	}
	if timeout <= 0 {
		timeout = z.cfg.CallTimeout
	}
	z.calls.Add(1)
	done := make(chan error, 1)
	go func() { done <- fn(lv) }()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case err := <-done:
		if err != nil && !lv.IsConnected() {
			return fmt.Errorf("%s: %w: %w", op, hypervisors.ErrUnreachable, err)
		}
		return classify(op, err)
	case <-t.C:
		z.markBroken(gen)
		return fmt.Errorf("%s: %w: no answer within %s, connection marked broken", op, hypervisors.ErrTransient, timeout)
	case <-ctx.Done():
		return fmt.Errorf("%s: %w: %w", op, hypervisors.ErrTransient, ctx.Err())
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
