package jsonhistory

import (
	"bufio"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/bigfleet-vm/provider/internal/termtext"
)

// Write renders h for people. With a machine query it prints each
// machine's events as a timeline (time since the first event) and a
// summary of every operation: how long it took and where the time went;
// otherwise a fleet timeline, every event in time order with its
// machine.
func Write(w io.Writer, h *History) error {
	bw := bufio.NewWriter(w)
	if h.Query.Machine != "" {
		for i := range h.Machines {
			machine(bw, &h.Machines[i])
		}
		if len(h.Machines) == 0 {
			fmt.Fprintf(bw, "machine %s: no history\n", termtext.Escape(h.Query.Machine))
		}
	} else {
		fleet(bw, h)
	}
	if h.Truncated {
		fmt.Fprintf(bw, "(older events left out: at most %d are listed)\n", MaxEvents)
	}
	return bw.Flush()
}

func machine(w io.Writer, m *Machine) {
	fmt.Fprintf(w, "machine %s  zone %s  state %s", termtext.Escape(m.ID), termtext.Escape(m.Zone), termtext.Escape(m.State))
	if m.Deleted != nil {
		fmt.Fprintf(w, " (left the document %s)", termtext.Stamp(*m.Deleted))
	}
	fmt.Fprintln(w)
	if len(m.Events) == 0 {
		fmt.Fprintln(w, "  no events")
		return
	}
	start := m.Events[0].At
	for _, e := range m.Events {
		fmt.Fprintf(w, "  %s  %9s  %s\n", termtext.Stamp(e.At), "+"+elapsed(e.At.Sub(start)), describe(&e))
	}
	for _, s := range operations(m.Events) {
		fmt.Fprintf(w, "  %s\n", s)
	}
	fmt.Fprintln(w)
}

func fleet(w io.Writer, h *History) {
	type row struct {
		m *Machine
		e *Event
	}
	var rows []row
	for i := range h.Machines {
		for j := range h.Machines[i].Events {
			rows = append(rows, row{&h.Machines[i], &h.Machines[i].Events[j]})
		}
	}
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].e.At.Before(rows[j].e.At) })
	if len(rows) == 0 {
		fmt.Fprintln(w, "no events")
		return
	}
	fmt.Fprintf(w, "%-20s  %-28s  %-10s  %s\n", "TIME", "MACHINE", "ZONE", "EVENT")
	for _, r := range rows {
		fmt.Fprintf(w, "%-20s  %-28s  %-10s  %s\n", termtext.Stamp(r.e.At), termtext.Escape(r.m.ID), termtext.Escape(r.m.Zone), describe(r.e))
	}
}

// describe is one event on one line.
func describe(e *Event) string {
	var b strings.Builder
	switch e.Kind {
	case "transition":
		from := e.From
		if from == "" {
			from = "(new)"
		}
		fmt.Fprintf(&b, "%s → %s", termtext.Escape(from), termtext.Escape(e.To))
	case "step":
		fmt.Fprintf(&b, "step %s %s in %s", termtext.Escape(e.Action), termtext.Escape(e.Outcome), elapsed(time.Duration(e.DurationMS)*time.Millisecond))
		if e.Reason != "" {
			fmt.Fprintf(&b, " [%s]", termtext.Escape(e.Reason))
		}
	case "guest":
		fmt.Fprintf(&b, "guest %s", termtext.Escape(e.Action))
		if e.Exit != nil {
			fmt.Fprintf(&b, " exited %d", *e.Exit)
		} else {
			fmt.Fprintf(&b, " %s", termtext.Escape(e.Outcome))
		}
	case "drift":
		fmt.Fprintf(&b, "drift %s: %s", termtext.Escape(e.Reason), termtext.Escape(e.Action))
	case "deleted":
		fmt.Fprintf(&b, "left the document (was %s)", termtext.Escape(e.From))
	default:
		b.WriteString(termtext.Escape(e.Kind))
	}
	if e.OpID != "" {
		fmt.Fprintf(&b, "  %s", termtext.Escape(e.OpID))
	}
	if e.Cause != "" {
		fmt.Fprintf(&b, " (%s)", termtext.Escape(e.Cause))
	}
	if e.Class != "" {
		fmt.Fprintf(&b, " class=%s", termtext.Escape(e.Class))
	}
	if e.Error != "" {
		fmt.Fprintf(&b, ": %s", termtext.Escape(e.Error))
	}
	return b.String()
}

// operations summarises each operation of the events: its transition,
// how long it took, and the time of its steps by action, longest first.
func operations(evs []Event) []string {
	type op struct {
		id, from, to string
		start, end   time.Time
		ended        bool
		by           map[string]time.Duration
	}
	var order []*op
	ops := map[string]*op{}
	for _, e := range evs {
		if e.OpID == "" {
			continue
		}
		o := ops[e.OpID]
		if o == nil {
			if e.Kind != "transition" {
				continue
			}
			o = &op{id: e.OpID, from: e.From, start: e.At, by: map[string]time.Duration{}}
			ops[e.OpID] = o
			order = append(order, o)
		}
		switch e.Kind {
		case "step":
			o.by[e.Action] += time.Duration(e.DurationMS) * time.Millisecond
		case "transition":
			if e.From != e.To && e.At.After(o.start) || e.Cause == "completed" || e.Cause == "timeout" || e.Cause == "error" {
				o.to, o.end, o.ended = e.To, e.At, true
			}
		}
	}
	var out []string
	for _, o := range order {
		if !o.ended {
			continue
		}
		actions := make([]string, 0, len(o.by))
		for a := range o.by {
			actions = append(actions, a)
		}
		sort.Slice(actions, func(i, j int) bool {
			if o.by[actions[i]] != o.by[actions[j]] {
				return o.by[actions[i]] > o.by[actions[j]]
			}
			return actions[i] < actions[j]
		})
		var parts []string
		for _, a := range actions {
			parts = append(parts, termtext.Escape(a)+" "+elapsed(o.by[a]))
		}
		s := fmt.Sprintf("%s %s → %s took %s", termtext.Escape(o.id), termtext.Escape(o.from), termtext.Escape(o.to), elapsed(o.end.Sub(o.start)))
		if len(parts) > 0 {
			s += ": " + strings.Join(parts, ", ")
		}
		out = append(out, s)
	}
	return out
}

// elapsed rounds d for people: tenths of a second under a minute, whole
// seconds above.
func elapsed(d time.Duration) string {
	if d < time.Minute {
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}
