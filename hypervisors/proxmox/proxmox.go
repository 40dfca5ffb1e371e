package proxmox

import (
	"bytes"
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
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvespec"
	"github.com/bigfleet-vm/provider/retry"
)

// Adapter drives one Proxmox VE cluster. It is safe for concurrent use.
type Adapter struct {
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

	// hc, resourcesURL and authHeader serve fetch, the one request made
	// without go-proxmox. authHeader holds the token secret: never log it.
	hc           *http.Client
	resourcesURL string
	authHeader   string

	// listSem serialises listings so concurrent callers share one; it
	// also guards listBuf.
	listSem chan struct{}
	listBuf bytes.Buffer
	cacheMu sync.Mutex
	listing *listing // nil: none, or forgotten by invalidate
	listGen uint64   // bumped by invalidate
	configs map[int]*cfgEntry
	dirty   map[int]bool // VMIDs this adapter changed since their last read
	// tmplSem serialises reads of the templates' storages; tmplMu guards
	// their cached answer.
	tmplSem      chan struct{}
	tmplMu       sync.Mutex
	tmplStorages *templateStorages
	owners       map[int]ownerNote // VMIDs this adapter cloned or marked
	// observed counts Observe calls; polls counts finished polls.
	observed atomic.Int64
	polls    atomic.Int64

	events *hypervisors.EventQueue
	// Poller state. healthMu guards health, polling and pending*; snap,
	// spare and baseline belong to the poller goroutine.
	healthMu  sync.Mutex
	polling   bool
	health    map[string]*nodeHealth
	pending   time.Time // time.Now() when the poll in flight began (zero: none)
	pendingAt time.Time // the same instant on Config.Now
	snap      map[int]vmState
	spare     map[int]vmState
	baseline  bool
	// afterPoll, when set before polling starts, is called after each
	// poll (tests).
	afterPoll func()

	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
}

var (
	_ hypervisors.Hypervisor     = (*Adapter)(nil)
	_ pvespec.Steps              = (*Adapter)(nil)
	_ hypervisors.HealthReporter = (*Adapter)(nil)
	_ hypervisors.EventSource    = (*Adapter)(nil)
)

// userAgent is sent with every request.
const userAgent = "bigfleet-provider"

// New validates cfg and returns an adapter. Unless PollInterval is
// negative it starts the cluster poller, whose first listing is requested
// at once (see ZoneHealth and Events); Close stops it. Preflight checks
// the cluster.
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
		owners:   map[int]ownerNote{},
		hc:       hc,
		listSem:  make(chan struct{}, 1),
		tmplSem:  make(chan struct{}, 1),
		events:   hypervisors.NewEventQueue(),
		health:   map[string]*nodeHealth{},
		snap:     map[int]vmState{},
		spare:    map[int]vmState{},

		resourcesURL: cfg.baseURL() + "/cluster/resources",
		authHeader:   "PVEAPIToken=" + cfg.TokenID + "=" + cfg.TokenSecret,
	}
	a.ctx, a.cancel = context.WithCancel(context.Background())
	for _, n := range cfg.Nodes {
		a.nodes[n] = true
		a.cloneSem[n] = make(chan struct{}, cfg.CloneConcurrency)
		a.health[n] = &nodeHealth{}
	}
	a.client = pxapi.NewClient(cfg.baseURL(),
		pxapi.WithHTTPClient(hc),
		pxapi.WithAPIToken(cfg.TokenID, cfg.TokenSecret),
		pxapi.WithUserAgent(userAgent),
		pxapi.WithRequestInterceptor(func(*http.Request) error { a.calls.Add(1); return nil }),
	)
	if cfg.PollInterval > 0 {
		t := time.NewTicker(cfg.PollInterval)
		a.startPolling(t.C, t.Stop)
	}
	return a, nil
}

// Apply performs one Proxmox step.
func (a *Adapter) Apply(ctx context.Context, t hypervisors.Target, p hypervisors.StepParams) (int, error) {
	return pvespec.Apply(ctx, a, t, p)
}

// Zones lists the configured nodes.
func (a *Adapter) Zones() []string { return append([]string(nil), a.cfg.Nodes...) }

// Close stops the poller (abandoning a poll in flight), closes the event
// channel and releases idle connections. It is idempotent.
func (a *Adapter) Close() error {
	a.closeOnce.Do(func() {
		a.cancel()
		a.wg.Wait()
		a.events.Close()
		a.hc.CloseIdleConnections()
	})
	return nil
}

// Calls returns the number of API requests made so far, polls included.
func (a *Adapter) Calls() int64 { return a.calls.Load() }

// Polls returns the number of polls finished so far.
func (a *Adapter) Polls() int64 { return a.polls.Load() }

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
	// A task that ran out of host memory or storage space (kvm's ENOMEM,
	// a clone's ENOSPC): named, and terminal.
	if r := hypervisors.ResourceOf(msg); r != "" {
		return &hypervisors.ResourceError{Resource: r, Err: err}
	}
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
				if r := hypervisors.ResourceOf(t.ExitStatus); r != "" {
					return &hypervisors.ResourceError{Resource: r, Err: fmt.Errorf("%s: task %s failed: %s", what, t.UPID, t.ExitStatus)}
				}
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
