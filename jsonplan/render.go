package jsonplan

import (
	"bytes"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
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
	r.line("%s", r.paint(ansiBold, fmt.Sprintf("Plan for %s installation %s", esc(p.Hypervisor), esc(p.Installation))))
	r.line("  state lineage %s serial %d; observed %s; planned %s", esc(orDash(p.Lineage)), p.Serial, stamp(p.ObservedAt), stamp(p.PlannedAt))
	if len(p.Zones) > 0 {
		r.line("")
		r.line("Zones:")
		for _, z := range p.Zones {
			st := esc(z.Status)
			if z.Status != "ok" {
				st = r.paint(ansiRed, st)
				if z.Error != "" {
					st += ": " + esc(z.Error)
				}
			}
			r.line("  %s  %s", esc(z.Name), st)
		}
	}
	for i := range p.Changes {
		r.line("")
		r.change(&p.Changes[i])
	}
	if len(p.Drift) > 0 {
		r.line("")
		r.line("Drift:")
		for _, d := range p.Drift {
			who := esc(d.Machine)
			if who == "" {
				who = "-"
			}
			vm := ""
			if d.VM != "" {
				vm = " vm " + esc(d.VM)
			}
			r.line("  %s %s %s%s: %s", r.paint(ansiMagenta, esc(d.Kind)), "("+esc(d.Policy)+")", esc(d.Zone)+" "+who, vm, esc(d.Detail))
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
		s := esc(kind) + " " + esc(in.OpID)
		if in.Cluster != "" {
			s += " cluster=" + esc(in.Cluster)
		}
		if in.Kind == "drain" {
			s += " grace=" + (time.Duration(in.Grace) * time.Second).String()
		}
		parts = append(parts, s)
	}
	switch {
	case c.Fail != "":
		parts = append(parts, "FAILED: "+esc(c.Fail))
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
	r.line("%s %s (%s, %s): %s", r.paint(ansiBold, "#"), r.paint(ansiBold, esc(c.Machine)), esc(c.Zone), esc(c.State), head)
	if a := c.Adopt; a != nil {
		s := "  adopt VM " + esc(a.Host)
		if a.VMName != "" && !strings.HasSuffix(a.Host, "/"+a.VMName) {
			s += " (" + esc(a.VMName) + ")"
		}
		if a.InstanceType != "" {
			s += " type=" + esc(a.InstanceType)
		}
		if a.Cluster != "" {
			s += " cluster=" + esc(a.Cluster)
		}
		r.line("%s", s)
	}
	if c.Wait != "" {
		r.line("  waiting: %s", esc(c.Wait))
	}
	for _, s := range c.Steps {
		sym := Glyph(s.Action)
		detail := stepDetail(&s)
		if detail != "" {
			detail = "  " + detail
		}
		r.line("  %s %s%s  %s", r.paint(symbolColor(sym), esc(sym)), esc(s.ID), detail, r.paint(ansiDim, "("+esc(s.Reason)+")"))
	}
	if c.Finish != "" {
		r.line("  => %s", esc(c.Finish))
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
		parts = append(parts, "pool="+esc(p.Overlay.Pool), "volume="+esc(p.Overlay.Name), "base="+esc(p.Overlay.BaseImage))
	case p.Seed != nil:
		parts = append(parts, "pool="+esc(p.Seed.Pool), "volume="+esc(p.Seed.Name))
	case p.Domain != nil:
		parts = append(parts, fmt.Sprintf("vcpu=%d memory=%dMiB", p.Domain.VCPU, p.Domain.MemoryMiB), "network="+esc(p.Domain.Network))
	case p.Clone != nil:
		parts = append(parts, "template="+strconv.Itoa(p.Clone.TemplateVMID))
		if p.Clone.Pool != "" {
			parts = append(parts, "pool="+esc(p.Clone.Pool))
		}
	case p.Size != nil:
		parts = append(parts, fmt.Sprintf("vcpu=%d memory=%dMiB onboot=%t", p.Size.VCPU, p.Size.MemoryMiB, p.Size.OnBoot))
	case p.Marker != nil:
		if p.Marker.Cluster != "" {
			parts = append(parts, "cluster="+esc(p.Marker.Cluster))
		} else {
			parts = append(parts, "cluster=(none)")
		}
	case p.Volume != "":
		parts = append(parts, "volume="+esc(p.Pool+"/"+p.Volume))
	}
	if s.Action == "autostart" {
		parts = append(parts, "autostart="+strconv.FormatBool(p.Autostart))
	}
	if s.Action == "stop" {
		g := p.Grace
		if g == "" {
			g = "0s" // omitted when zero
		}
		parts = append(parts, "grace="+esc(g))
	}
	if len(p.Exec) > 0 && s.Action != "exec-drain" {
		parts = append(parts, "exec="+esc(p.Exec[0]))
	}
	if p.BlobPath != "" {
		parts = append(parts, "blob_path="+esc(p.BlobPath))
	}
	if len(s.DependsOn) > 1 {
		// Only joins are worth showing; a chain is the listing order.
		prefix := s.ID[:strings.LastIndexByte(s.ID, '/')+1]
		deps := make([]string, 0, len(s.DependsOn))
		for _, d := range s.DependsOn {
			deps = append(deps, strings.TrimPrefix(d, prefix))
		}
		sort.Strings(deps)
		parts = append(parts, "after="+esc(strings.Join(deps, ",")))
	}
	return strings.Join(parts, " ")
}

// esc returns s as it is when every rune is printable, and otherwise
// Go-quoted ("a\x1b[2Jb"), so that nothing a client or a hypervisor wrote
// (a cluster_id, a machine id, a hook's output in a last_error) can move
// the cursor, recolour, clear or forge lines of an operator's terminal:
// control characters (C0, DEL, C1), format characters such as bidi
// overrides, and invalid UTF-8 are shown escaped. The quotes make an
// escaped string distinguishable from one that merely contains a
// backslash. The JSON plan carries the exact strings.
func esc(s string) string {
	if !utf8.ValidString(s) {
		return strconv.Quote(s)
	}
	for _, r := range s {
		if !strconv.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
