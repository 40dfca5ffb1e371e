package proxmox

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	pxapi "github.com/luthermonson/go-proxmox"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/retry"
)

// Adapter drives one Proxmox VE cluster. It is safe for concurrent use.
type Adapter struct {
	hypervisors.Unsupported

	cfg    Config
	log    *slog.Logger
	client *pxapi.Client
	nodes  map[string]bool

	calls atomic.Int64

	cloneSem map[string]chan struct{}

	allocMu  sync.Mutex
	inflight map[int]bool // VMIDs reserved by clones in progress here
	nextHint int          // next VMID to try (0: ask /cluster/nextid)
	// lost maps a machine to the VMID of its last clone request whose
	// answer was lost: the next CloneVM for the machine asks for that VMID
	// again, so a clone PVE made late is met ("already exists", then the
	// marker check) instead of duplicated under a new VMID.
	lost map[string]int

	listMu   sync.Mutex // serialises listings so concurrent zones share one
	cacheMu  sync.Mutex
	listing  []pxapi.ClusterResource
	listAt   time.Time
	configs  map[int]*cfgEntry
	dirty    map[int]bool // VMIDs this adapter changed since their last read
	observed atomic.Int64 // Observe calls
}

var _ hypervisors.Hypervisor = (*Adapter)(nil)

// New validates cfg and returns an adapter; it makes no API call (see
// Preflight).
func New(cfg Config, logger *slog.Logger) (*Adapter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("proxmox config: %w", err)
	}
	cfg.defaults()
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	hc, err := cfg.httpClient()
	if err != nil {
		return nil, fmt.Errorf("proxmox tls: %w", err)
	}
	a := &Adapter{
		cfg:      cfg,
		log:      logger,
		nodes:    map[string]bool{},
		cloneSem: map[string]chan struct{}{},
		inflight: map[int]bool{},
		lost:     map[string]int{},
		configs:  map[int]*cfgEntry{},
		dirty:    map[int]bool{},
	}
	for _, n := range cfg.Nodes {
		a.nodes[n] = true
		a.cloneSem[n] = make(chan struct{}, cfg.CloneConcurrency)
	}
	a.client = pxapi.NewClient(cfg.baseURL(),
		pxapi.WithHTTPClient(hc),
		pxapi.WithAPIToken(cfg.TokenID, cfg.TokenSecret),
		pxapi.WithUserAgent("bigfleet-provider"),
		pxapi.WithRequestInterceptor(func(*http.Request) error { a.calls.Add(1); return nil }),
	)
	return a, nil
}

// Shape reports ShapeProxmox.
func (a *Adapter) Shape() hypervisors.Shape { return hypervisors.ShapeProxmox }

// Zones lists the configured nodes.
func (a *Adapter) Zones() []string { return append([]string(nil), a.cfg.Nodes...) }

// Close releases idle connections.
func (a *Adapter) Close() error { return nil }

// Calls returns the number of API requests made so far.
func (a *Adapter) Calls() int64 { return a.calls.Load() }

// Interrupted is the error class for a context that ended.
func ctxErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: %w", hypervisors.ErrTransient, err)
	}
	return nil
}

var (
	statusPrefix = regexp.MustCompile(`^(\d{3}) `)
	notRunning   = regexp.MustCompile(`VM \d+ is not running`)
)

// classify wraps a raw go-proxmox / net error with its class. The result
// never contains the token (go-proxmox errors carry the status line only;
// url errors carry the URL, which holds no secret).
func classify(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	var class error
	var denied *DeniedError
	switch {
	case errors.As(err, &denied):
		class = hypervisors.ErrPermission
	case errors.Is(err, ErrFingerprintMismatch):
		class = hypervisors.ErrPermission
	case errors.Is(err, pxapi.ErrNotAuthorized):
		class = hypervisors.ErrPermission
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		class = hypervisors.ErrTransient
	case strings.Contains(msg, "can't lock file"), strings.Contains(msg, "VM is locked"),
		strings.Contains(msg, "detected modified configuration"):
		class = hypervisors.ErrLocked
	case strings.Contains(msg, "QEMU guest agent is not running"), notRunning.MatchString(msg):
		class = hypervisors.ErrAgentNotReady
	case strings.Contains(msg, "No QEMU guest agent configured"):
		class = hypervisors.ErrInvalid
	case strings.Contains(msg, "does not exist"), strings.Contains(msg, "no such VM"):
		class = hypervisors.ErrNotFound
	case strings.Contains(msg, "already exists"):
		class = hypervisors.ErrExists
	case strings.HasPrefix(msg, "bad request:"):
		class = hypervisors.ErrInvalid
	}
	var se *StatusError
	if class == nil && errors.As(err, &se) {
		class = hypervisors.ErrInvalid
		if se.Code >= 500 {
			class = hypervisors.ErrTransient
		}
	}
	if class == nil {
		if m := statusPrefix.FindStringSubmatch(msg); m != nil {
			if m[1][0] == '5' {
				class = hypervisors.ErrTransient
			} else {
				class = hypervisors.ErrInvalid
			}
		}
	}
	if class == nil {
		var ue *url.Error
		var ne net.Error
		var ce *tls.CertificateVerificationError
		switch {
		case errors.As(err, &ce):
			class = hypervisors.ErrPermission
		case errors.As(err, &ue) && strings.Contains(msg, "certificate"):
			class = hypervisors.ErrPermission
		case errors.As(err, &ne) && ne.Timeout():
			class = hypervisors.ErrTransient
		case errors.As(err, &ue), errors.As(err, &ne):
			class = hypervisors.ErrUnreachable
		}
	}
	if class == nil {
		return err
	}
	return fmt.Errorf("%w: %w", class, err)
}

// sleep waits d or until ctx is done (then a transient error).
func sleep(ctx context.Context, d time.Duration) error {
	if err := retry.Sleep(ctx, d); err != nil {
		return ctxErr(ctx)
	}
	return nil
}

// poll is the schedule of waiting for a task, a clone lock or a guest
// process to end (progress checks, not retries).
func (a *Adapter) poll() retry.Policy {
	return retry.Policy{Initial: a.cfg.PollMin, Max: a.cfg.PollMax}
}

// waitTask polls a task until it stops (Config.PollMin..PollMax, bounded
// by ctx; a transient poll failure is polled again) and fails unless the
// exit status is OK.
func (a *Adapter) waitTask(ctx context.Context, t *pxapi.Task, what string) error {
	if t == nil {
		return fmt.Errorf("%s: server returned no task id: %w", what, hypervisors.ErrTransient)
	}
	b := a.poll().Backoff()
	for {
		if err := t.Ping(ctx); err != nil {
			err = classify(err)
			if !errors.Is(err, hypervisors.ErrTransient) || ctx.Err() != nil {
				return fmt.Errorf("%s: poll task %s: %w", what, t.UPID, err)
			}
		} else if t.IsCompleted {
			if t.ExitStatus != "OK" {
				class := hypervisors.ErrTransient
				if strings.Contains(t.ExitStatus, "can't lock file") || strings.Contains(t.ExitStatus, "locked") {
					class = hypervisors.ErrLocked
				}
				return fmt.Errorf("%s: task %s failed: %s: %w", what, t.UPID, t.ExitStatus, class)
			}
			return nil
		}
		if err := sleep(ctx, b.Next()); err != nil {
			return fmt.Errorf("%s: wait for task %s: %w", what, t.UPID, err)
		}
	}
}

func (a *Adapter) checkZone(zone string) error {
	if !a.nodes[zone] {
		return fmt.Errorf("zone %q is not a configured node: %w", zone, hypervisors.ErrInvalid)
	}
	return nil
}

// vmHandle returns a go-proxmox VM bound to node/vmid without any request.
func (a *Adapter) vmHandle(node string, vmid int) *pxapi.VirtualMachine {
	v := &pxapi.VirtualMachine{}
	v.New(a.client, node, vmid)
	return v
}

// readVM reads status/current and config (2 requests).
func (a *Adapter) readVM(ctx context.Context, node string, vmid int) (*pxapi.VirtualMachine, error) {
	v := a.vmHandle(node, vmid)
	if err := classify(v.Ping(ctx)); err != nil {
		return nil, err
	}
	return v, nil
}

// tagList splits a PVE tag string (nil when there is none).
func tagList(s string) []string {
	var out []string
	return append(out, strings.FieldsFunc(s, func(r rune) bool { return r == ';' || r == ',' || r == ' ' })...)
}
