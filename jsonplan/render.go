package jsonplan

import (
	"bytes"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/bigfleet-vm/provider/internal/termtext"
)

// TextOptions shape the human plan.
type TextOptions struct {
	// Color adds ANSI colour; callers set it only for a terminal.
	Color bool
}

// RenderText decodes a JSON plan (checking its version) and renders it
// as the human, terraform-plan style text: zones, one block per machine
// with its intent and steps, the drift, and a summary line starting
// "Plan: N to create, N to configure, N to drain, N to delete" (or "No
// changes.").
func RenderText(w io.Writer, planJSON []byte, opts TextOptions) error {
	p, err := Decode(planJSON)
	if err != nil {
		return err
	}
	return Write(w, p, opts)
}

// Write renders a decoded JSON plan as text (see RenderText).
func Write(w io.Writer, p *Plan, opts TextOptions) error {
	r := &textRenderer{color: opts.Color}
	r.plan(p)
	_, err := w.Write(r.b.Bytes())
	return err
}

const (
	ansiReset   = "\x1b[0m"
	ansiBold    = "\x1b[1m"
	ansiRed     = "\x1b[31m"
	ansiGreen   = "\x1b[32m"
	ansiYellow  = "\x1b[33m"
	ansiCyan    = "\x1b[36m"
	ansiMagenta = "\x1b[35m"
	ansiDim     = "\x1b[2m"
)

type textRenderer struct {
	b     bytes.Buffer
	color bool
}

func (r *textRenderer) paint(code, s string) string {
	if !r.color || s == "" {
		return s
	}
	return code + s + ansiReset
}

func (r *textRenderer) line(format string, a ...any) {
	fmt.Fprintf(&r.b, format, a...)
	r.b.WriteByte('\n')
}

func symbolColor(sym string) string {
	switch sym {
	case "+":
		return ansiGreen
	case "-":
		return ansiRed
	case ">":
		return ansiCyan
	}
	return ansiYellow
}

func (r *textRenderer) plan(p *Plan) {
	r.line("%s", r.paint(ansiBold, fmt.Sprintf("Plan for %s installation %s", termtext.Escape(p.Hypervisor), termtext.Escape(p.Installation))))
	r.line("  state lineage %s serial %d; observed %s; planned %s", termtext.Escape(orDash(p.Lineage)), p.Serial, termtext.Stamp(p.ObservedAt), termtext.Stamp(p.PlannedAt))
	if len(p.Zones) > 0 {
		r.line("")
		r.line("Zones:")
		for _, z := range p.Zones {
			st := termtext.Escape(z.Status)
			if z.Status != "ok" {
				st = r.paint(ansiRed, st)
				if z.Error != "" {
					st += ": " + termtext.Escape(z.Error)
				}
			}
			r.line("  %s  %s", termtext.Escape(z.Name), st)
		}
	}
	if p.Capacity != nil {
		r.line("")
		r.capacity(p.Capacity)
	}
	for i := range p.Changes {
		r.line("")
		r.change(&p.Changes[i])
	}
	if len(p.Drift) > 0 {
		r.line("")
		r.line("Drift:")
		for _, d := range p.Drift {
			who := termtext.Escape(d.Machine)
			if who == "" {
				who = "-"
			}
			vm := ""
			if d.VM != "" {
				vm = " vm " + termtext.Escape(d.VM)
			}
			r.line("  %s %s %s%s: %s", r.paint(ansiMagenta, termtext.Escape(d.Kind)), "("+termtext.Escape(d.Policy)+")", termtext.Escape(d.Zone)+" "+who, vm, termtext.Escape(d.Detail))
		}
	}
	r.line("")
	s := p.Summary
	if !p.HasChanges() {
		msg := "No changes."
		if s.Drift > 0 {
			msg += fmt.Sprintf(" %d drift reported.", s.Drift)
		}
		r.line("%s", r.paint(ansiBold, msg))
		return
	}
	line := fmt.Sprintf("Plan: %d to create, %d to configure, %d to drain, %d to delete", s.Create, s.Configure, s.Drain, s.Delete)
	if s.Repair > 0 {
		line += fmt.Sprintf(", %d to repair", s.Repair)
	}
	if s.Fail > 0 {
		line += fmt.Sprintf(", %d to fail", s.Fail)
	}
	if s.Adopt > 0 {
		line += fmt.Sprintf(", %d to adopt", s.Adopt)
	}
	line += fmt.Sprintf("; %d drift.", s.Drift)
	r.line("%s", r.paint(ansiBold, line))
}

// headline says what a change is for: its intent, "repair", "adopt" or
// "FAILED: <reason>".
func headline(c *Change) string {
	var parts []string
	if in := c.Intent; in != nil {
		kind := in.Kind
		if kind != "" {
			kind = strings.ToUpper(kind[:1]) + kind[1:]
		}
		s := termtext.Escape(kind) + " " + termtext.Escape(in.OpID)
		if in.Cluster != "" {
			s += " cluster=" + termtext.Escape(in.Cluster)
		}
		if in.Kind == "drain" {
			s += " grace=" + (time.Duration(in.Grace) * time.Second).String()
		}
		parts = append(parts, s)
	}
	switch {
	case c.Fail != "":
		parts = append(parts, "FAILED: "+termtext.Escape(c.Fail))
	case c.Adopt != nil:
		parts = append(parts, "adopt")
	case c.Intent == nil && len(c.Steps) > 0:
		parts = append(parts, "repair")
	case len(parts) == 0 && c.Wait != "":
		parts = append(parts, "wait")
	}
	return strings.Join(parts, " -> ")
}

func (r *textRenderer) change(c *Change) {
	head := headline(c)
	if c.Fail != "" {
		head = r.paint(ansiRed, head)
	}
	r.line("%s %s (%s, %s): %s", r.paint(ansiBold, "#"), r.paint(ansiBold, termtext.Escape(c.Machine)), termtext.Escape(c.Zone), termtext.Escape(c.State), head)
	if a := c.Adopt; a != nil {
		s := "  adopt VM " + termtext.Escape(a.Host)
		if a.VMName != "" && !strings.HasSuffix(a.Host, "/"+a.VMName) {
			s += " (" + termtext.Escape(a.VMName) + ")"
		}
		if a.InstanceType != "" {
			s += " type=" + termtext.Escape(a.InstanceType)
		}
		if a.Cluster != "" {
			s += " cluster=" + termtext.Escape(a.Cluster)
		}
		r.line("%s", s)
	}
	if c.Wait != "" {
		r.line("  waiting: %s", termtext.Escape(c.Wait))
	}
	for _, s := range c.Steps {
		sym := StepGlyph(&s)
		detail := stepDetail(&s)
		if detail != "" {
			detail = "  " + detail
		}
		r.line("  %s %s%s  %s", r.paint(symbolColor(sym), termtext.Escape(sym)), termtext.Escape(s.ID), detail, r.paint(ansiDim, "("+termtext.Escape(s.Reason)+")"))
	}
	if c.Finish != "" {
		r.line("  => %s", termtext.Escape(c.Finish))
	}
}

// stepDetail summarises the parameters people check: sizes, clusters,
// grace periods, volumes. It never prints exec argv of the bootstrap
// beyond its program (the blob is never in a plan anyway).
func stepDetail(s *Step) string {
	p := &s.Params
	var parts []string
	if s.Target.VMID != 0 {
		parts = append(parts, "vmid="+strconv.Itoa(s.Target.VMID))
	}
	switch {
	case p.Overlay != nil:
		parts = append(parts, "pool="+termtext.Escape(p.Overlay.Pool), "volume="+termtext.Escape(p.Overlay.Name), "base="+termtext.Escape(p.Overlay.BaseImage))
	case p.Seed != nil:
		parts = append(parts, "pool="+termtext.Escape(p.Seed.Pool), "volume="+termtext.Escape(p.Seed.Name))
	case p.Domain != nil:
		parts = append(parts, fmt.Sprintf("vcpu=%d memory=%dMiB", p.Domain.VCPU, p.Domain.MemoryMiB), "network="+termtext.Escape(p.Domain.Network))
	case p.Clone != nil:
		parts = append(parts, "template="+strconv.Itoa(p.Clone.TemplateVMID))
		if p.Clone.Pool != "" {
			parts = append(parts, "pool="+termtext.Escape(p.Clone.Pool))
		}
	case p.Size != nil:
		parts = append(parts, fmt.Sprintf("vcpu=%d memory=%dMiB onboot=%t", p.Size.VCPU, p.Size.MemoryMiB, p.Size.OnBoot))
	case p.Marker != nil:
		if p.Marker.Cluster != "" {
			parts = append(parts, "cluster="+termtext.Escape(p.Marker.Cluster))
		} else {
			parts = append(parts, "cluster=(none)")
		}
	case p.Volume != "":
		parts = append(parts, "volume="+termtext.Escape(p.Pool+"/"+p.Volume))
	case p.Ext != nil:
		keys := slices.Sorted(maps.Keys(p.Ext.Args))
		for _, k := range keys {
			parts = append(parts, termtext.Escape(k)+"="+termtext.Escape(p.Ext.Args[k]))
		}
	}
	if s.Action == "autostart" {
		parts = append(parts, "autostart="+strconv.FormatBool(p.Autostart))
	}
	if s.Action == "stop" {
		g := p.Grace
		if g == "" {
			g = "0s" // omitted when zero
		}
		parts = append(parts, "grace="+termtext.Escape(g))
	}
	if len(p.Exec) > 0 && s.Action != "exec-drain" {
		parts = append(parts, "exec="+termtext.Escape(p.Exec[0]))
	}
	if p.BlobPath != "" {
		parts = append(parts, "blob_path="+termtext.Escape(p.BlobPath))
	}
	if len(s.DependsOn) > 1 {
		// Only joins are worth showing; a chain is the listing order.
		prefix := s.ID[:strings.LastIndexByte(s.ID, '/')+1]
		deps := make([]string, 0, len(s.DependsOn))
		for _, d := range s.DependsOn {
			deps = append(deps, strings.TrimPrefix(d, prefix))
		}
		sort.Strings(deps)
		parts = append(parts, "after="+termtext.Escape(strings.Join(deps, ",")))
	}
	return strings.Join(parts, " ")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// capacity renders the capacity section: per zone, offered and running
// against the host, the ratios, OVER past the allowed ratio, and the
// pool; or why the host is unknown.
func (r *textRenderer) capacity(c *Capacity) {
	r.line("Capacity (overcommit allowed up to %s):", strconv.FormatFloat(c.MaxRatio, 'g', -1, 64))
	for _, z := range c.Zones {
		name := termtext.Escape(z.Zone)
		if z.Status != "ok" || z.Host == nil {
			why := termtext.Escape(z.Status)
			if z.Error != "" {
				why += ": " + termtext.Escape(z.Error)
			}
			r.line("  %s  host %s", name, r.paint(ansiRed, why))
			r.line("  %s  offered %d vCPUs, %d MiB; running %d vCPUs, %d MiB", strings.Repeat(" ", len(name)),
				z.Offered.VCPU, z.Offered.MemoryBytes>>20, z.Running.VCPU, z.Running.MemoryBytes>>20)
			continue
		}
		over := map[string]bool{}
		for _, o := range z.Over {
			over[o] = true
		}
		flag := func(resource string) string {
			if !over[resource] {
				return ""
			}
			return "  " + r.paint(ansiRed, "OVER")
		}
		pad := strings.Repeat(" ", len(name))
		r.line("  %s  cpu     %d vCPUs offered on %d CPUs%s, %d running%s", name, z.Offered.VCPU, z.Host.CPUs, ratio(z.CPURatio), z.Running.VCPU, flag("cpu"))
		r.line("  %s  memory  %d MiB offered on %d MiB%s, %d MiB running%s", pad, z.Offered.MemoryBytes>>20, z.Host.MemoryBytes>>20, ratio(z.MemoryRatio), z.Running.MemoryBytes>>20, flag("memory"))
		if d := z.Host.Disk; d != nil {
			r.line("  %s  disk    %s: %.1f GiB free of %.1f GiB", pad, termtext.Escape(d.Storage), float64(d.FreeBytes)/(1<<30), float64(d.TotalBytes)/(1<<30))
		}
	}
}

func ratio(v *float64) string {
	if v == nil {
		return ""
	}
	return " (ratio " + strconv.FormatFloat(*v, 'f', 2, 64) + ")"
}
