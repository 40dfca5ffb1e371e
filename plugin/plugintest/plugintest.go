package plugintest

import (
	"flag"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/plugin"
)

// Problems records what a resolution reports, one "--flag: message" line
// each; bounded flags are always inside their bounds.
type Problems struct{ Lines []string }

func (p *Problems) Add(f, format string, args ...any) {
	p.Lines = append(p.Lines, "--"+f+": "+fmt.Sprintf(format, args...))
}
func (p *Problems) AddErr(f string, err error)          { p.Add(f, "%v", err) }
func (p *Problems) Duration(string, time.Duration) bool { return true }
func (p *Problems) Integer(string, int) bool            { return true }
func (p *Problems) CABundle(f, file string)             { p.Add(f, "CA bundle %s", file) }

// Resolve parses args as pl's flags and resolves them (real: the real
// backend is selected), returning the result and the problems reported.
func Resolve(t testing.TB, pl plugin.Plugin, real bool, defaultZone string, args ...string) (plugin.Resolved, []string) {
	t.Helper()
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	f := pl.RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	var p Problems
	r := f.Resolve(plugin.Env{Set: set, Real: real, DefaultZone: defaultZone, Now: time.Now()}, &p)
	return r, p.Lines
}
