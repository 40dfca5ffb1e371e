package jsonplan

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"time"
)

// FormatVersion is the newest version of the JSON plan this build
// writes and reads in full, as "MAJOR.MINOR". The rule
// (docs/plan-format.md): an addition a reader may ignore (a new optional
// field, a new value of an enumerated field) bumps MINOR; anything that
// changes or removes what an existing field means bumps MAJOR. A plan is
// written in the lowest version that expresses it (VersionFor), so a plan
// without the newer optional sections reads exactly as before.
// docs/plan.schema.json describes exactly the versions of Versions.
const FormatVersion = "1.2"

// baseMinor is the minor version of a plan that uses none of the
// additions below (1.1: what every plan was before them).
const baseMinor = 1

// additions are the optional sections a minor version after baseMinor
// added, each with how to see it in a plan. VersionFor and Decode both
// read this table: a new optional section joins it here.
var additions = []struct {
	minor int
	what  string
	in    func(*Plan) bool
}{
	{2, "capacity", func(p *Plan) bool { return p.Capacity != nil }},
	{2, "a plug-in hypervisor (a hypervisor, a step action, a drift kind or params.ext format 1.1 does not define)", usesPlugin},
}

// Hypervisors11 are the hypervisor names format 1.1 defines.
var Hypervisors11 = []string{"libvirt", "proxmox"}

// DriftKinds11 are the drift kinds format 1.1 defines: the core's and
// those the libvirt and Proxmox plug-ins declare. A later format lets any
// plug-in declare its own (^[a-z][a-z-]{0,31}$).
var DriftKinds11 = []string{"missing", "stopped", "paused", "resized", "orphan", "unmanaged-name-collision", "unknown-host",
	"leaked", "seed-mismatch"}

// VersionFor is the format_version p is written in: the lowest that
// expresses it (1.1 for a plan that uses no addition of a later minor).
func VersionFor(p *Plan) string {
	minor := baseMinor
	for _, a := range additions {
		if a.minor > minor && a.in(p) {
			minor = a.minor
		}
	}
	major, _, _ := ParseVersion(FormatVersion)
	return strconv.Itoa(major) + "." + strconv.Itoa(minor)
}

// Versions lists the format_versions this build writes, oldest first.
func Versions() []string {
	major, newest, _ := ParseVersion(FormatVersion)
	var out []string
	for m := baseMinor; m <= newest; m++ {
		out = append(out, strconv.Itoa(major)+"."+strconv.Itoa(m))
	}
	return out
}

// Plan is the document `provider plan --json` prints and /debug/plan
// serves.
type Plan struct {
	FormatVersion string    `json:"format_version"`
	Hypervisor    string    `json:"hypervisor"`
	Installation  string    `json:"installation"`
	Lineage       string    `json:"lineage"`
	Serial        uint64    `json:"serial"`
	ObservedAt    time.Time `json:"observed_at"`
	PlannedAt     time.Time `json:"planned_at"`
	Zones         []Zone    `json:"zones"`
	Changes       []Change  `json:"changes"`
	Drift         []Drift   `json:"drift"`
	Summary       Summary   `json:"summary"`
	// Capacity (format 1.2) holds each zone's offerings against its host;
	// absent when the plan was made without reading capacity
	// (--capacity-check=off, or an adapter that cannot read it).
	Capacity *Capacity `json:"capacity,omitempty"`
}

// Capacity is the plan's capacity section: each zone's offerings and
// running machines against its host's capacity.
type Capacity struct {
	// MaxRatio is the overcommit ratio allowed (--capacity-overcommit).
	MaxRatio float64        `json:"max_ratio"`
	Zones    []ZoneCapacity `json:"zones"`
}

// ZoneCapacity is one zone's comparison. Offered and Running come from
// the desired document; Host from the hypervisor, absent when it could
// not be read (Status unknown, Error says why): no figure is invented.
type ZoneCapacity struct {
	Zone   string     `json:"zone"`
	Status string     `json:"status"` // ok | unknown
	Error  string     `json:"error,omitempty"`
	ReadAt *time.Time `json:"read_at,omitempty"`
	Host   *Host      `json:"host,omitempty"`
	// Offered is what the zone's offerings can place (every slot times
	// its instance type), Running the slots not SPECULATIVE.
	Offered Resources `json:"offered"`
	Running Resources `json:"running"`
	// CPURatio and MemoryRatio are offered over host (absent when the host
	// did not report the resource), rounded to 3 decimals.
	CPURatio    *float64 `json:"cpu_ratio,omitempty"`
	MemoryRatio *float64 `json:"memory_ratio,omitempty"`
	// Over lists the resources (cpu, memory) whose ratio exceeds MaxRatio.
	Over []string `json:"over,omitempty"`
}

// Host is a zone's host as its hypervisor reported it.
type Host struct {
	CPUs        int    `json:"cpus"`
	MemoryBytes uint64 `json:"memory_bytes"`
	Disk        *Disk  `json:"disk,omitempty"`
}

// Disk is the zone's pool (libvirt) or target storage (Proxmox).
type Disk struct {
	Storage    string `json:"storage"`
	TotalBytes uint64 `json:"total_bytes"`
	FreeBytes  uint64 `json:"free_bytes"`
}

// Resources is an amount of the compared resources.
type Resources struct {
	VCPU        int    `json:"vcpu"`
	MemoryBytes uint64 `json:"memory_bytes"`
}

// Zone is a zone's observation status as the plan saw it.
type Zone struct {
	Name   string `json:"name"`
	Status string `json:"status"` // ok | unknown
	Error  string `json:"error,omitempty"`
}

// Change is everything planned for one machine.
type Change struct {
	Machine string  `json:"machine"`
	Zone    string  `json:"zone"`
	State   string  `json:"state"`
	Intent  *Intent `json:"intent,omitempty"`
	VM      *Target `json:"vm,omitempty"`
	Steps   []Step  `json:"steps,omitempty"`
	Finish  string  `json:"finish,omitempty"`
	Fail    string  `json:"fail,omitempty"`
	Adopt   *Adopt  `json:"adopt,omitempty"`
	Wait    string  `json:"wait,omitempty"`
}

// Empty reports whether the change does nothing (a Wait alone does
// nothing).
func (c *Change) Empty() bool {
	return len(c.Steps) == 0 && c.Finish == "" && c.Fail == "" && c.Adopt == nil
}

// Intent summarises the transition a change serves.
type Intent struct {
	Kind    string `json:"kind"`
	OpID    string `json:"op_id"`
	Cluster string `json:"cluster,omitempty"`
	Grace   int64  `json:"grace_seconds,omitempty"`
}

// Adopt records an owned VM for a machine.
type Adopt struct {
	Host         string `json:"host"`
	VMName       string `json:"vm_name"`
	VMID         int    `json:"vmid,omitempty"`
	Cluster      string `json:"cluster,omitempty"`
	InstanceType string `json:"instance_type,omitempty"`
}

// Target names one VM: a libvirt domain by name, a Proxmox VM by VMID.
type Target struct {
	Zone string `json:"zone"`
	Name string `json:"name,omitempty"`
	VMID int    `json:"vmid,omitempty"`
}

// Step is one hypervisor operation.
type Step struct {
	ID        string   `json:"id"`
	Action    string   `json:"action"`
	Target    Target   `json:"target"`
	DependsOn []string `json:"depends_on,omitempty"`
	Params    Params   `json:"params"`
	Reason    string   `json:"reason"`
}

// Params are the parameters of one step; only those of its action are set.
type Params struct {
	Overlay   *Overlay `json:"overlay,omitempty"`
	Seed      *Seed    `json:"seed,omitempty"`
	Domain    *Domain  `json:"domain,omitempty"`
	Clone     *Clone   `json:"clone,omitempty"`
	Size      *Size    `json:"size,omitempty"`
	Marker    *Marker  `json:"marker,omitempty"`
	Exec      []string `json:"exec,omitempty"`
	BlobPath  string   `json:"blob_path,omitempty"`
	Pool      string   `json:"pool,omitempty"`
	Volume    string   `json:"volume,omitempty"`
	Grace     string   `json:"grace,omitempty"` // a Go duration, e.g. "1m0s"
	Autostart bool     `json:"autostart,omitempty"`
	// Ext holds the parameters of a plug-in action format 1.1 does not
	// define (format 1.2).
	Ext *Ext `json:"ext,omitempty"`
}

// Ext is a plug-in step's published parameters: its effect (how the
// human plan marks it) and its arguments, as strings so they round-trip
// byte for byte.
type Ext struct {
	Effect string            `json:"effect"`
	Args   map[string]string `json:"args,omitempty"`
}

// effectGlyphs are the human plan's marks of an Ext's effect.
var effectGlyphs = map[string]string{"create": "+", "start": ">", "change": "~", "destroy": "-"}

// usesPlugin reports whether p needs format 1.2's plug-in hypervisors: a
// hypervisor, a step action or params.ext that format 1.1 does not define.
func usesPlugin(p *Plan) bool {
	if p.Hypervisor != "" && !slices.Contains(Hypervisors11, p.Hypervisor) {
		return true
	}
	for i := range p.Drift {
		if !slices.Contains(DriftKinds11, p.Drift[i].Kind) {
			return true
		}
	}
	for i := range p.Changes {
		for j := range p.Changes[i].Steps {
			s := &p.Changes[i].Steps[j]
			if _, ok := glyphs[s.Action]; !ok || s.Params.Ext != nil {
				return true
			}
		}
	}
	return false
}

// Overlay is a copy-on-write disk volume backed by the golden image.
type Overlay struct {
	Pool           string `json:"pool"`
	Name           string `json:"name"`
	BaseImage      string `json:"base_image"`
	MinCapacityGiB int    `json:"min_capacity_gib,omitempty"`
}

// Seed is a cloud-init NoCloud volume.
type Seed struct {
	Pool       string `json:"pool"`
	Name       string `json:"name"`
	InstanceID string `json:"instance_id"`
	Hostname   string `json:"hostname"`
	UserData   string `json:"user_data,omitempty"`
}

// Domain is a libvirt domain definition.
type Domain struct {
	Name       string            `json:"name"`
	VCPU       int               `json:"vcpu"`
	MemoryMiB  int               `json:"memory_mib"`
	DomainType string            `json:"domain_type"`
	Pool       string            `json:"pool"`
	Overlay    string            `json:"overlay"`
	Seed       string            `json:"seed"`
	Network    string            `json:"network"`
	Kernel     string            `json:"kernel,omitempty"`
	Initrd     string            `json:"initrd,omitempty"`
	Cmdline    string            `json:"cmdline,omitempty"`
	Marker     Marker            `json:"marker"`
	Labels     map[string]string `json:"labels,omitempty"`
}

// Clone is a Proxmox full clone of a template.
type Clone struct {
	Name         string            `json:"name"`
	TemplateVMID int               `json:"template_vmid"`
	Pool         string            `json:"pool,omitempty"`
	Marker       Marker            `json:"marker"`
	Labels       map[string]string `json:"labels,omitempty"`
}

// Size is the Proxmox VM configuration applied after a clone.
type Size struct {
	VCPU      int    `json:"vcpu"`
	MemoryMiB int    `json:"memory_mib"`
	OnBoot    bool   `json:"onboot"`
	Marker    Marker `json:"marker"`
}

// Marker is the ownership marker stamped on a VM.
type Marker struct {
	Installation string `json:"installation"`
	MachineID    string `json:"machine_id"`
	OpID         string `json:"op_id,omitempty"`
	InstanceType string `json:"instance_type,omitempty"`
	Cluster      string `json:"cluster,omitempty"`
}

// Drift is one difference between desired and observed.
type Drift struct {
	Machine string `json:"machine,omitempty"`
	Zone    string `json:"zone"`
	VM      string `json:"vm,omitempty"`
	Kind    string `json:"kind"`
	Policy  string `json:"policy"` // repair | report | fail | adopt
	Detail  string `json:"detail"`
}

// Summary counts a plan's changes the way the human plan prints them.
type Summary struct {
	Create    int `json:"create"`
	Configure int `json:"configure"`
	Drain     int `json:"drain"`
	Delete    int `json:"delete"`
	Repair    int `json:"repair"`
	Fail      int `json:"fail"`
	Adopt     int `json:"adopt"`
	Drift     int `json:"drift"`
	Steps     int `json:"steps"`
}

// HasChanges reports whether applying the plan would do anything.
func (p *Plan) HasChanges() bool {
	for i := range p.Changes {
		if !p.Changes[i].Empty() {
			return true
		}
	}
	return false
}

// glyphs are the step actions of format 1.x with the glyph the human
// plan marks them with: + creates, > starts, ~ changes or runs something
// in the guest, - destroys.
var glyphs = map[string]string{
	"create-overlay": "+", "create-seed": "+", "define": "+", "clone": "+",
	"start": ">", "resume": ">",
	"configure-vm": "~", "autostart": "~", "wait-agent": "~", "bind": "~",
	"exec-bootstrap": "~", "exec-ready": "~", "exec-drain": "~", "unbind": "~",
	"stop": "-", "undefine": "-", "delete-volume": "-", "delete-vm": "-",
}

// Glyph is the human plan's one-character marker of an action; "?" for an
// action this build does not know (from a plan of a newer minor version).
func Glyph(action string) string {
	if g, ok := glyphs[action]; ok {
		return g
	}
	return "?"
}

// StepGlyph is the mark of one step: its action's, or for a plug-in
// action its ext effect's; "?" when neither is known.
func StepGlyph(s *Step) string {
	if g := Glyph(s.Action); g != "?" || s.Params.Ext == nil {
		return g
	}
	if g, ok := effectGlyphs[s.Params.Ext.Effect]; ok {
		return g
	}
	return "?"
}

// Actions lists the step actions of format 1.1, sorted (format 1.2 adds
// any plug-in action).
func Actions() []string {
	out := make([]string, 0, len(glyphs))
	for a := range glyphs {
		out = append(out, a)
	}
	sort.Strings(out)
	return out
}

// Marshal encodes a plan as indented JSON with a final newline: the only
// encoder of the JSON plan, shared by `provider plan --json` and
// /debug/plan. It writes format_version VersionFor(p), whatever p says.
func Marshal(p *Plan) ([]byte, error) {
	c := *p
	c.FormatVersion = VersionFor(p)
	b, err := json.MarshalIndent(&c, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode plan: %w", err)
	}
	return append(b, '\n'), nil
}

// versionRE is MAJOR.MINOR in decimal without leading zeros.
var versionRE = regexp.MustCompile(`^(0|[1-9][0-9]{0,5})\.(0|[1-9][0-9]{0,5})$`)

// ParseVersion splits a format_version into its major and minor numbers.
func ParseVersion(v string) (major, minor int, err error) {
	m := versionRE.FindStringSubmatch(v)
	if m == nil {
		return 0, 0, fmt.Errorf("format_version %s is not MAJOR.MINOR", quoteBounded(v))
	}
	major, _ = strconv.Atoi(m[1])
	minor, _ = strconv.Atoi(m[2])
	return major, minor, nil
}

// Decode reads a JSON plan. It refuses a plan without a well-formed
// format_version, of another major version, with a field or section its
// version does not define (for a minor up to this build's: a 1.1 plan
// with a capacity section is refused), or with anything after the plan. A newer minor version is read, its unknown fields
// ignored: by the version rule they only add to what this build knows.
func Decode(planJSON []byte) (*Plan, error) {
	var head struct {
		FormatVersion *string `json:"format_version"`
	}
	if err := json.Unmarshal(planJSON, &head); err != nil {
		return nil, fmt.Errorf("decode plan: %w", err)
	}
	if head.FormatVersion == nil {
		return nil, errors.New("decode plan: no format_version: not a JSON plan")
	}
	major, minor, err := ParseVersion(*head.FormatVersion)
	if err != nil {
		return nil, fmt.Errorf("decode plan: %w", err)
	}
	myMajor, myMinor, _ := ParseVersion(FormatVersion)
	if major != myMajor {
		return nil, fmt.Errorf("decode plan: format_version %s is not supported (this build reads %d.x, up to %s)",
			*head.FormatVersion, myMajor, FormatVersion)
	}
	var p Plan
	dec := json.NewDecoder(bytes.NewReader(planJSON))
	if minor <= myMinor {
		dec.DisallowUnknownFields()
	}
	if err := dec.Decode(&p); err != nil {
		// An unknown field's name comes from the input: bound it.
		return nil, fmt.Errorf("decode plan (format_version %s): %s", *head.FormatVersion, bounded(err.Error(), 200))
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("decode plan: data after the plan")
	}
	if minor <= myMinor {
		// A section a later minor added is not what this version claims.
		for _, a := range additions {
			if a.minor > minor && a.in(&p) {
				return nil, fmt.Errorf("decode plan: format_version %s carries %s, which format_version %d.%d added", *head.FormatVersion, a.what, major, a.minor)
			}
		}
	}
	return &p, nil
}

// bounded cuts s to n bytes for an error message.
func bounded(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// quoteBounded quotes s, cut to 32 bytes, for an error message.
func quoteBounded(s string) string {
	if len(s) > 32 {
		return strconv.Quote(s[:32]) + "..."
	}
	return strconv.Quote(s)
}
