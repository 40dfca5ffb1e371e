package guestsim

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/bigfleet-vm/provider/hypervisors/guest"
)

// The simulated wrapper (guest.Script): the same claims, records and
// reports, kept as data. Records of non-repeat commands are saved
// (State) and survive a Restore, as the real ones survive on the guest's
// disk; claims end with the boot.

// maxRecords bounds the records a guest keeps (the real wrapper forgets
// records after guest.RecordDays): past it, the oldest ended ones go.
const maxRecords = 256

// Record is a recorded command as saved.
type Record struct {
	Boot    int       `json:"boot"`
	Started time.Time `json:"started"`
	// Until is when it exits; Forever: never.
	Until   time.Time `json:"until,omitzero"`
	Forever bool      `json:"forever,omitempty"`
	// Exit and Out are recorded once it ended.
	Exit *int   `json:"exit,omitempty"`
	Out  string `json:"out,omitempty"`
	// Pending is how it will end (known at its start unless its program
	// has an Exit), used once Until passed.
	Pending *Ending `json:"pending,omitempty"`
	// Target is the staged file it put in place (removed at its end).
	Target     string `json:"target,omitempty"`
	Superseded bool   `json:"superseded,omitempty"`

	repeat bool
	runner int // pid in this simulator (0 after a Restore)
}

// Ending is how a recorded command ends.
type Ending struct {
	Code int    `json:"code"`
	Out  string `json:"out,omitempty"`
}

func scriptSum() string {
	s := sha256.Sum256([]byte(guest.Script))
	return hex.EncodeToString(s[:])
}

var wrapperSum = scriptSum()

// wrapperCall is a parsed wrapper invocation.
type wrapperCall struct {
	records, claims, key string
	staged, target, prev string
	repeat               bool
	argv                 []string
}

func parseWrapper(argv []string) (wrapperCall, bool) {
	if len(argv) < 7 || argv[2] != "run" {
		return wrapperCall{}, false
	}
	c := wrapperCall{records: argv[3], claims: argv[4], key: argv[5]}
	rest := argv[6:]
	for len(rest) > 0 {
		switch {
		case rest[0] == "-b" && len(rest) >= 3:
			c.staged, c.target = rest[1], rest[2]
			rest = rest[3:]
		case rest[0] == "-s" && len(rest) >= 2:
			c.prev = rest[1]
			rest = rest[2:]
		case rest[0] == "-r":
			c.repeat = true
			rest = rest[1:]
		case rest[0] == "--" && len(rest) >= 2:
			c.argv = rest[1:]
			return c, true
		default:
			return wrapperCall{}, false
		}
	}
	return wrapperCall{}, false
}

func report(state string, out string) Run {
	return Run{Stdout: "bigfleet-op v1 " + state + "\n" + out}
}

// wrapper runs the simulated wrapper; g.mu is held.
func (g *Guest) wrapper(p *Proc) Run {
	f, ok := g.files[guest.WrapperPath]
	if !ok || f.Sum != wrapperSum {
		return Run{ExitCode: 2, Stderr: "/bin/sh: 0: cannot open " + guest.WrapperPath + ": No such file\n"}
	}
	c, ok := parseWrapper(p.Argv)
	if !ok {
		return Run{ExitCode: 2, Stderr: "op-v1.sh: usage: run RECORDS CLAIMS KEY [opts] -- ARGV\n"}
	}
	rk, ck := path.Join(c.records, c.key), path.Join(c.claims, c.key)
	if c.repeat {
		if holder, held := g.claims[ck]; held && g.runnerAlive(holder) {
			return report(fmt.Sprintf("running %d", holder), "")
		}
	} else {
		if state, out := g.state(rk, ck); state != "none" {
			if c.staged != "" && (strings.HasPrefix(state, "exited") || strings.HasPrefix(state, "running") || strings.HasPrefix(state, "dead")) {
				g.remove(c.staged) // started already: a file staged again for it is not needed
			}
			return report(state, out)
		}
		if c.staged != "" {
			if _, ok := g.files[c.staged]; !ok {
				return report("noblob", "")
			}
		}
		if c.prev != "" {
			prev := g.records[path.Join(c.records, c.prev)]
			if prev == nil {
				prev = &Record{}
				g.records[path.Join(c.records, c.prev)] = prev
			}
			prev.Superseded = true
		}
		g.forgetRecords()
	}
	g.claims[ck] = p.PID
	rec := &Record{Boot: g.boot, Started: time.Now(), repeat: c.repeat, runner: p.PID}
	g.records[rk] = rec
	g.touched()
	if c.target != "" {
		sf := g.files[c.staged]
		delete(g.files, c.staged)
		g.files[c.target] = sf
		rec.Target = c.target
	}
	inner := &Proc{g: g, Argv: c.argv, PID: p.PID, Key: c.key}
	g.logExec(c.argv)
	run := g.start(inner)
	if run.Forever {
		rec.Forever = true
	} else {
		rec.Until = rec.Started.Add(run.For)
	}
	if run.Exit == nil {
		rec.Pending = &Ending{Code: exitStatus(run), Out: tail(run.Stdout + run.Stderr)}
	}
	exit := run.Exit
	return Run{Polls: run.Polls, For: run.For, Forever: run.Forever, Exit: func(*Proc) Run {
		end := Ending{}
		if exit != nil {
			r := exit(inner)
			end = Ending{Code: exitStatus(r), Out: tail(r.Stdout + r.Stderr)}
		} else {
			end = *rec.Pending
		}
		g.end(rec, ck, end)
		return report(fmt.Sprintf("exited %d", end.Code), end.Out)
	}}
}

// end records a command's end; g.mu is held.
func (g *Guest) end(rec *Record, claim string, e Ending) {
	if rec.Exit != nil {
		return
	}
	code := e.Code
	rec.Exit, rec.Out, rec.Pending = &code, e.Out, nil
	if rec.Target != "" {
		delete(g.files, rec.Target)
	}
	if rec.repeat {
		delete(g.claims, claim)
	}
	g.touched()
}

func exitStatus(r Run) int {
	if r.Signal != 0 {
		return 128 + r.Signal
	}
	return r.ExitCode
}

func tail(s string) string {
	if len(s) > guest.OutputTail {
		s = s[len(s)-guest.OutputTail:]
	}
	return s
}

// runnerAlive reports whether a wrapper process is still running; g.mu
// is held.
func (g *Guest) runnerAlive(pid int) bool {
	pr, ok := g.procs[pid]
	if !ok {
		return false
	}
	if pr.ended() {
		g.finish(pr)
		return false
	}
	return true
}

// state is the wrapper's report for a record and claim; g.mu is held.
func (g *Guest) state(rk, ck string) (string, string) {
	rec := g.records[rk]
	if rec != nil && rec.Exit == nil && !rec.Superseded && !rec.Started.IsZero() {
		// Settle it: a runner of this simulator that ended records its end
		// now; a record restored without its runner ends when its time
		// comes, as the real guest would have run it on.
		if rec.runner != 0 {
			g.runnerAlive(rec.runner)
		} else if rec.Boot == g.boot && !rec.Forever && rec.Pending != nil && !time.Now().Before(rec.Until) {
			g.end(rec, ck, *rec.Pending)
		}
	}
	switch {
	case rec != nil && rec.Exit != nil:
		return fmt.Sprintf("exited %d", *rec.Exit), rec.Out
	case rec != nil && rec.Superseded:
		return "superseded", ""
	case rec != nil && !rec.Started.IsZero():
		alive := rec.Boot == g.boot && (rec.runner != 0 && g.runnerAlive(rec.runner) ||
			rec.runner == 0 && (rec.Forever || time.Now().Before(rec.Until)))
		switch {
		case alive && rec.runner != 0:
			return fmt.Sprintf("running %d", rec.runner), ""
		case alive:
			return "running 1", ""
		case rec.Exit != nil:
			return fmt.Sprintf("exited %d", *rec.Exit), rec.Out
		case rec.Boot != g.boot:
			return "dead rebooted", ""
		}
		return fmt.Sprintf("dead %d", rec.runner), ""
	}
	if holder, held := g.claims[ck]; held {
		if g.runnerAlive(holder) {
			return fmt.Sprintf("starting %d", holder), ""
		}
		return "lost", ""
	}
	return "none", ""
}

// forgetRecords drops the oldest ended records past maxRecords; g.mu is
// held.
func (g *Guest) forgetRecords() {
	if len(g.records) < maxRecords {
		return
	}
	keys := make([]string, 0, len(g.records))
	for k, r := range g.records {
		if r.Exit != nil || r.Superseded {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool { return g.records[keys[i]].Started.Before(g.records[keys[j]].Started) })
	for _, k := range keys {
		if len(g.records) < maxRecords {
			return
		}
		delete(g.records, k)
	}
}

// Claim makes key claimed in this boot by a claimant that died before it
// started the command (a wrapper killed in its first moments), for tests
// of the "lost" path. records and claims are the wrapper's directories.
func (g *Guest) Claim(claims, key string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.nextPID++
	g.claims[path.Join(claims, key)] = g.nextPID // a pid no process has
}

// Records returns the recorded commands by key (records directory/key),
// as saved.
func (g *Guest) Records() map[string]Record {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make(map[string]Record, len(g.records))
	for k, r := range g.records {
		out[k] = *r
	}
	return out
}

func isWrapper(argv []string) bool {
	return len(argv) >= 2 && argv[0] == "/bin/sh" && argv[1] == guest.WrapperPath ||
		len(argv) >= 2 && strings.HasSuffix(argv[0], "/sh") && argv[1] == guest.WrapperPath
}
