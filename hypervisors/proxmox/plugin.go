package proxmox

import (
	"context"
	"encoding/hex"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"path"
	"regexp"
	"strings"
	"time"
	"unicode"

	"github.com/bigfleet-vm/provider/conffile"
	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/proxmoxsim"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvespec"
	"github.com/bigfleet-vm/provider/hypervisors/simcore"
	"github.com/bigfleet-vm/provider/inventory"
	"github.com/bigfleet-vm/provider/planner"
	"github.com/bigfleet-vm/provider/plugin"
)

// Plugin is the Proxmox hypervisor as the composition root registers it:
// its flags, their resolution, its catalog and capacity rules, its
// planner, the go-proxmox adapter, the Proxmox-shaped simulator and the
// pve-sim subcommand.
func Plugin() plugin.Plugin { return pxPlugin{} }

type pxPlugin struct{}

func (pxPlugin) Info() plugin.Info {
	return plugin.Info{Name: "proxmox", Title: "Proxmox", FlagGroup: "Proxmox connection and clone parameters",
		DefaultZone: "pve", CreateTimeout: 8 * time.Minute,
		Backend: plugin.Backend{Flag: "proxmox-backend", Real: "proxmox", ConnFlag: "proxmox-api-url", RealNoun: "Proxmox cluster", RealNouns: "Proxmox"}}
}

// flagValues are the Proxmox flags registered on a FlagSet.
type flagValues struct {
	backend, apiURL, tokenID                    *string
	tokenSecret, tokenFile, caFile, fingerprint *string
	pool, nodes, bootstrapPath, bootstrapExec   *string
	templateVMID                                *int
	pollInterval                                *time.Duration
}

func (pxPlugin) RegisterFlags(fs *flag.FlagSet) plugin.Flags {
	f := &flagValues{}
	f.backend = fs.String("proxmox-backend", "auto", "proxmox, fake or auto (proxmox when --proxmox-api-url is set; otherwise refuse unless --use-fake-backend).")
	f.apiURL = fs.String("proxmox-api-url", "", "Proxmox API URL, e.g. https://host:8006/api2/json (https only). Required for the proxmox backend.")
	f.tokenID = fs.String("proxmox-token-id", "", "API token id, USER@REALM!TOKENID.")
	f.tokenSecret = fs.String("proxmox-token-secret", "", "API token secret (visible in the process list; prefer --proxmox-token-file).")
	f.tokenFile = fs.String("proxmox-token-file", "", "File holding the API token secret. Wins over --proxmox-token-secret.")
	f.caFile = fs.String("proxmox-ca-file", "", "PEM CA bundle verifying the Proxmox API certificate, e.g. /etc/pve/pve-root-ca.pem.")
	f.fingerprint = fs.String("proxmox-tls-fingerprint", "", "Pinned SHA-256 fingerprint of the API certificate (alternative or addition to --proxmox-ca-file).")
	f.pool = fs.String("proxmox-pool", "", "Resource pool clones are placed in (least-privilege scope).")
	f.nodes = fs.String("nodes", "", "Comma list of cluster node names, each a zone. Required for the proxmox backend.")
	f.templateVMID = fs.Int("template-vmid", 9000, "Source template VMID of the built-in catalog and of catalog entries without template_vmid.")
	f.bootstrapPath = fs.String("bootstrap-path", "/run/bigfleet-bootstrap", "In-guest path the bootstrap blob is written to before it runs.")
	f.bootstrapExec = fs.String("bootstrap-exec", "/bin/sh", "Comma-separated argv that runs the bootstrap; the path is appended as the final argument.")
	f.pollInterval = fs.Duration("proxmox-poll-interval", time.Second, "How often the cluster is listed (one GET /cluster/resources) to see drift and node health within seconds; 0 = only the periodic pass. Between 250ms and 1m.")
	return f
}

func (*flagValues) Names() []string {
	return []string{"proxmox-backend", "proxmox-api-url", "proxmox-token-id", "proxmox-token-secret",
		"proxmox-token-file", "proxmox-ca-file", "proxmox-tls-fingerprint", "proxmox-pool",
		"nodes", "template-vmid", "bootstrap-path", "bootstrap-exec", "proxmox-poll-interval"}
}

func (f *flagValues) Usage() []string { return f.Names() }

func (*flagValues) Bounds() plugin.Bounds {
	return plugin.Bounds{
		Durations: map[string]plugin.DurationBound{
			"proxmox-poll-interval": {Min: 250 * time.Millisecond, Max: time.Minute, Off: true, Why: "each poll makes PVE build a listing of every VM"},
		},
		Ints: map[string]plugin.IntBound{
			"template-vmid": {Min: pvespec.MinVMID, Max: pvespec.MaxVMID, Why: "the Proxmox VMID range"},
		},
	}
}

func (f *flagValues) Backend() (string, bool) {
	return *f.backend, strings.TrimSpace(*f.apiURL) != ""
}

func (*flagValues) ReportsDefaultZone(map[string]bool) bool { return false }

// Settings are the resolved Proxmox flags.
type Settings struct {
	APIURL      string
	TokenID     string
	TokenSecret plugin.Secret
	CAFile      string
	// Fingerprint is the pinned SHA-256 of the API certificate as 64
	// lowercase hex digits, or "".
	Fingerprint   string
	Pool          string
	Nodes         []string
	TemplateVMID  int
	BootstrapPath string
	BootstrapExec []string
	// PollInterval is --proxmox-poll-interval: how often the cluster is
	// listed for drift and node health (0: never).
	PollInterval time.Duration

	zones []string
}

// tokenIDRE is the USER@REALM!TOKENID shape of a Proxmox API token id.
var tokenIDRE = regexp.MustCompile(`^[^\s@!=]+@[^\s@!=]+![^\s@!=]+$`)

// Resolve fills Settings. --nodes are kept as the zones when the real
// backend is selected and they parsed cleanly. The token secret never
// reaches an error message.
func (f *flagValues) Resolve(env plugin.Env, p plugin.Problems) plugin.Resolved {
	x := &Settings{}
	real, set := env.Real, env.Set
	x.TemplateVMID = *f.templateVMID
	p.Integer("template-vmid", x.TemplateVMID)
	x.Pool = strings.TrimSpace(*f.pool)
	if strings.ContainsAny(x.Pool, "/,") || strings.ContainsFunc(x.Pool, unicode.IsSpace) {
		p.Add("proxmox-pool", "%q is not a Proxmox pool name (no '/', ',' or whitespace)", x.Pool)
	}
	x.BootstrapPath = *f.bootstrapPath
	if !path.IsAbs(x.BootstrapPath) {
		p.Add("bootstrap-path", "%q must be an absolute in-guest path, e.g. /run/bigfleet-bootstrap", x.BootstrapPath)
	}
	if argv, err := plugin.ParseArgv(*f.bootstrapExec); err != nil {
		p.Add("bootstrap-exec", "%v", err)
	} else {
		x.BootstrapExec = argv
	}
	x.PollInterval = *f.pollInterval
	p.Duration("proxmox-poll-interval", x.PollInterval)

	if raw := strings.TrimSpace(*f.apiURL); raw != "" {
		if err := checkAPIURL(raw); err != nil {
			p.Add("proxmox-api-url", "%v", err)
		}
		x.APIURL = raw
	} else if real {
		p.Add("proxmox-api-url", "is required by the proxmox backend, e.g. https://pve1.example.internal:8006/api2/json")
	}

	x.TokenID = strings.TrimSpace(*f.tokenID)
	switch {
	case x.TokenID != "" && !tokenIDRE.MatchString(x.TokenID):
		// Never echo the value: people paste USER@REALM!TOKENID=SECRET.
		p.Add("proxmox-token-id", "does not have the USER@REALM!TOKENID shape, e.g. bigfleet@pve!autoscaler (the value is not shown in case it holds the secret; pass the secret with --proxmox-token-file)")
	case x.TokenID == "" && real:
		p.Add("proxmox-token-id", "is required by the proxmox backend, e.g. bigfleet@pve!autoscaler")
	}

	switch {
	case *f.tokenFile != "":
		data, err := conffile.Read(*f.tokenFile, conffile.MaxSecretBytes)
		switch {
		case err != nil:
			p.Add("proxmox-token-file", "cannot read the token secret: %v", err)
		case strings.TrimSpace(string(data)) == "":
			p.Add("proxmox-token-file", "file %s is empty; write the API token secret into it", *f.tokenFile)
		default:
			x.TokenSecret = plugin.Secret(strings.TrimSpace(string(data)))
		}
	case strings.TrimSpace(*f.tokenSecret) != "":
		x.TokenSecret = plugin.Secret(strings.TrimSpace(*f.tokenSecret))
	case set["proxmox-token-secret"]:
		p.Add("proxmox-token-secret", "is empty; pass the secret with --proxmox-token-file instead")
	case real:
		p.Add("proxmox-token-file", "a token secret is required by the proxmox backend: pass --proxmox-token-file (preferred) or --proxmox-token-secret")
	}

	x.CAFile = *f.caFile
	if x.CAFile != "" {
		p.CABundle("proxmox-ca-file", x.CAFile)
	}
	if *f.fingerprint != "" {
		fp, err := normaliseFingerprint(*f.fingerprint)
		if err != nil {
			p.Add("proxmox-tls-fingerprint", "%v", err)
		}
		x.Fingerprint = fp
	}
	if real && x.CAFile == "" && *f.fingerprint == "" {
		p.Add("proxmox-ca-file", "the proxmox backend needs a way to verify the API certificate: pass --proxmox-ca-file (e.g. /etc/pve/pve-root-ca.pem) and/or --proxmox-tls-fingerprint")
	}

	nodes, err := parseNodes(*f.nodes)
	switch {
	case err != nil:
		p.Add("nodes", "%v", err)
	case nodes == nil && (real || set["nodes"]):
		p.Add("nodes", "lists no node names; pass the cluster's nodes, e.g. --nodes pve1,pve2,pve3")
	}
	x.Nodes = nodes
	if real && err == nil {
		x.zones = nodes
	}
	return x
}

// checkAPIURL accepts only https URLs with a host and no credentials.
func checkAPIURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%q does not parse as a URL: %v", hypervisors.RedactURL(raw), urlErrorReason(err))
	}
	switch {
	case strings.EqualFold(u.Scheme, "http"):
		return fmt.Errorf("%q uses http://, which would send the API token in clear text; use https://", u.Redacted())
	case !strings.EqualFold(u.Scheme, "https"):
		return fmt.Errorf("%q must be an https:// URL, e.g. https://pve1.example.internal:8006/api2/json", u.Redacted())
	case u.User != nil:
		return fmt.Errorf("%q embeds credentials; remove them and use --proxmox-token-id with --proxmox-token-file", u.Redacted())
	case u.Hostname() == "":
		return fmt.Errorf("%q names no host", u.Redacted())
	}
	return nil
}

// normaliseFingerprint turns a SHA-256 fingerprint with optional ':' or
// whitespace separators, in either case, into 64 lowercase hex digits.
func normaliseFingerprint(s string) (string, error) {
	fp := strings.ToLower(strings.Map(func(r rune) rune {
		if r == ':' || unicode.IsSpace(r) {
			return -1
		}
		return r
	}, s))
	if _, err := hex.DecodeString(fp); err != nil || len(fp) != 64 {
		return "", fmt.Errorf("%q is not a SHA-256 fingerprint: want 64 hex digits, optionally separated by ':' (e.g. the output of openssl x509 -noout -fingerprint -sha256)", s)
	}
	return fp, nil
}

// parseNodes splits --nodes: entries trimmed, empty ones skipped, each a
// valid zone name, no duplicates. No names at all yields nil, nil.
func parseNodes(s string) ([]string, error) {
	var nodes []string
	for n := range strings.SplitSeq(s, ",") {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		if err := inventory.ValidateZone(n); err != nil {
			return nil, fmt.Errorf("node name: %w", err)
		}
		for _, seen := range nodes {
			if seen == n {
				return nil, fmt.Errorf("node %q is listed twice; list each node once", n)
			}
		}
		nodes = append(nodes, n)
	}
	return nodes, nil
}

// urlErrorReason drops the *url.Error wrapper, which repeats the URL.
func urlErrorReason(err error) error {
	if ue, ok := err.(*url.Error); ok {
		return ue.Err
	}
	return err
}

func (x *Settings) Zones() ([]string, string) { return x.zones, "nodes" }

// Capacity: Proxmox VMs are deletable clones, never a fixed free pool.
func (x *Settings) Capacity() inventory.CapacityType { return inventory.OnDemand }

// ValidateTemplateVMID reports why vmid cannot name a Proxmox template.
func ValidateTemplateVMID(vmid int) error {
	if vmid < pvespec.MinVMID || vmid > pvespec.MaxVMID {
		return fmt.Errorf("template VMID %d is outside the Proxmox VMID range %d..%d", vmid, pvespec.MinVMID, pvespec.MaxVMID)
	}
	return nil
}

// Catalog: pve.* built-in types cloning --template-vmid; an entry may
// name its own template (0 or omitted: --template-vmid).
func (x *Settings) Catalog() inventory.CatalogRules {
	tv := x.TemplateVMID
	return inventory.CatalogRules{Prefix: "pve.", DefaultSource: tv, Keys: "vcpu, memory_mib, template_vmid",
		Source: func(v *int) (int, error) {
			if v == nil || *v == 0 {
				return tv, nil
			}
			if err := ValidateTemplateVMID(*v); err != nil {
				return *v, fmt.Errorf("template_vmid: %w", err)
			}
			return *v, nil
		}}
}

func (x *Settings) CapacityRules() inventory.CapacityRules {
	return inventory.CapacityRules{Where: "a self-hosted Proxmox cluster", RefuseBareMetal: func(spelling string) error {
		return fmt.Errorf("capacity_type %q is not supported on Proxmox: its VMs are deletable clones, not a fixed free pool; use on_demand", spelling)
	}}
}

// Certs: the API token authenticates; no client certificate.
func (x *Settings) Certs() []plugin.CertFile { return nil }

func (x *Settings) Summary() (string, []slog.Attr) {
	return fmt.Sprintf(" api_url=%s token_id=%s token_secret=%s nodes=%s", x.APIURL, x.TokenID, x.TokenSecret, strings.Join(x.Nodes, ",")),
		[]slog.Attr{slog.String("api_url", x.APIURL), slog.String("token_id", x.TokenID), slog.Any("token_secret", x.TokenSecret),
			slog.Any("nodes", x.Nodes)}
}

func (x *Settings) Planner(plugin.PlannerOptions) planner.Plugin {
	return Planner(PlanSettings{Pool: x.Pool, BootstrapPath: x.BootstrapPath, BootstrapExec: x.BootstrapExec})
}

// Open builds the go-proxmox adapter and runs the startup preflight (API
// version, nodes, templates, token privileges), which reports every
// problem at once.
func (x *Settings) Open(ctx context.Context, o plugin.OpenOptions) (hypervisors.Hypervisor, error) {
	seen := map[int]bool{}
	var templates []int
	for _, name := range o.Catalog.Names() {
		if v := o.Catalog[name].Source; v != 0 && !seen[v] {
			seen[v] = true
			templates = append(templates, v)
		}
	}
	a, err := New(Config{APIURL: x.APIURL, TokenID: x.TokenID, TokenSecret: x.TokenSecret.Reveal(),
		CAFile: x.CAFile, Fingerprint: x.Fingerprint, Pool: x.Pool, Nodes: x.Nodes, Installation: o.Installation,
		Templates: templates, CloneConcurrency: o.MaxConcurrentPerZone, PollInterval: pollInterval(x.PollInterval)}, o.Logger.With("hypervisor", "proxmox"))
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := a.Preflight(pctx, templates); err != nil {
		a.Close()
		return nil, fmt.Errorf("proxmox preflight: %w", err)
	}
	return a, nil
}

// pollInterval maps --proxmox-poll-interval to the adapter's setting, where
// a negative interval turns the poller off.
func pollInterval(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// OpenSimulator opens the Proxmox-shaped simulator with the
// --template-vmid template on the first zone and every other template
// the catalog names.
func (x *Settings) OpenSimulator(o plugin.SimOptions) (hypervisors.Hypervisor, error) {
	opts := proxmoxsim.Options{
		Options: simcore.Options{Zones: o.Zones, Latency: o.Latency, Faults: o.Faults, SlowOK: o.SlowOK, Host: o.Host,
			BootstrapPath: x.BootstrapPath, State: o.State, ReadOnly: o.ReadOnly},
		TemplateVMID: x.TemplateVMID,
	}
	for _, it := range o.Catalog {
		if it.Source != 0 && it.Source != x.TemplateVMID {
			opts.Templates = append(opts.Templates, proxmoxsim.Template{VMID: it.Source, Zone: o.Zones[0], Name: fmt.Sprintf("template-%d", it.Source)})
		}
	}
	if o.Journal != nil {
		opts.Store = o.Journal
	}
	return proxmoxsim.OpenProxmox(opts)
}

// String summarises the settings without the token secret: a resolved
// configuration printed with any verb never shows it.
func (x *Settings) String() string {
	text, _ := x.Summary()
	return "proxmox{" + strings.TrimSpace(text) + "}"
}

// GoString is String, for %#v.
func (x *Settings) GoString() string { return x.String() }

// LogValue is the Summary's attributes.
func (x *Settings) LogValue() slog.Value {
	_, attrs := x.Summary()
	return slog.GroupValue(attrs...)
}
