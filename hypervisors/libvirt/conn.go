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
)

// errNotConnected is returned for calls on a zone whose connection is down.
var errNotConnected = errors.New("not connected")

// zoneConn owns the connection to one zone. The background loop (run)
// is the only code that dials or replaces lv; calls read it under mu.
type zoneConn struct {
	zone   string
	uri    *url.URL
	cfg    *Config
	log    *slog.Logger
	calls  *atomic.Int64
	dialFn func(u *url.URL) (*golibvirt.Libvirt, error)

	mu      sync.Mutex
	lv      *golibvirt.Libvirt
	lastErr error
	gen     uint64        // bumped on every new connection
	broken  chan struct{} // closed to ask run to drop the connection
	ready   chan struct{} // closed when the first dial attempt has finished
	once    sync.Once
}

func newZoneConn(zone string, u *url.URL, cfg *Config, log *slog.Logger, calls *atomic.Int64) *zoneConn {
	return &zoneConn{
		zone: zone, uri: u, cfg: cfg, log: log, calls: calls,
		dialFn:  golibvirt.ConnectToURI,
		lastErr: fmt.Errorf("zone %s: %w: not dialled yet", zone, hypervisors.ErrUnreachable),
		broken:  make(chan struct{}),
		ready:   make(chan struct{}),
	}
}

// run keeps the zone connected until ctx ends, redialling with backoff.
func (z *zoneConn) run(ctx context.Context) {
	backoff := z.cfg.MinBackoff
	for {
		lv, err := z.dial(ctx)
		z.once.Do(func() { close(z.ready) })
		if err != nil {
			z.mu.Lock()
			z.lastErr = fmt.Errorf("zone %s: %w: %w", z.zone, hypervisors.ErrUnreachable, err)
			z.mu.Unlock()
			z.log.Warn("libvirt dial failed", "zone", z.zone, "err", err, "retry_in", backoff)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, z.cfg.MaxBackoff)
			continue
		}
		backoff = z.cfg.MinBackoff
		z.mu.Lock()
		z.lv, z.lastErr = lv, nil
		z.gen++
		broken := make(chan struct{})
		z.broken = broken
		z.mu.Unlock()
		z.log.Info("libvirt connected", "zone", z.zone)

		var why error
		select {
		case <-ctx.Done():
			why = errors.New("closed")
		case <-lv.Disconnected():
			why = errors.New("connection lost")
		case <-broken:
			why = errors.New("a call timed out")
		}
		z.mu.Lock()
		z.lv = nil
		z.lastErr = fmt.Errorf("zone %s: %w: %w", z.zone, hypervisors.ErrUnreachable, why)
		z.mu.Unlock()
		// Disconnect sends a close RPC first, which can hang on a wedged
		// daemon: never wait for it here.
		go func() { _ = lv.Disconnect() }()
		if ctx.Err() != nil {
			return
		}
		z.log.Warn("libvirt connection dropped", "zone", z.zone, "err", why)
	}
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
		return r.lv, r.err
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

// health is nil when connected, else why not.
func (z *zoneConn) health() error {
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.lv != nil {
		return nil
	}
	return z.lastErr
}

// current returns the live client and its generation, or an error wrapping
// ErrUnreachable.
func (z *zoneConn) current() (*golibvirt.Libvirt, uint64, error) {
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.lv == nil {
		return nil, 0, z.lastErr
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
