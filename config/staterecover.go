package config

import "flag"

// RecoverTruncate is the one value of --state-recover: drop damaged or
// missing acknowledged records of a file state (statefile Options.Recover).
const RecoverTruncate = "truncate"

// stateFlags are the flags about the local state file beyond --state.
type stateFlags struct {
	stateRecover *string
}

func (f *Flags) registerState(fs *flag.FlagSet) {
	f.stateRecover = fs.String("state-recover", "", "With a file --state: \"truncate\" starts once past damage to acknowledged records (a damaged frame, a journal cut short, a lost mark): the state is rebuilt from what precedes the damage, the dropped records are reported, operation ids never regress and every fence epoch accepted before is refused. Remove it after that start.")
}

// resolveState reads --state-recover.
func (f *Flags) resolveState(c *Config, set map[string]bool, p *problems) {
	if !set["state-recover"] {
		return
	}
	switch {
	case *f.stateRecover != RecoverTruncate:
		p.add("state-recover", "unknown value %q; the only one is %s", clip(*f.stateRecover), RecoverTruncate)
	case c.StatePath == "" || c.Etcd != nil:
		p.add("state-recover", "only applies to a file --state (an etcd state does not lose acknowledged records this way)")
	default:
		c.StateRecover = true
	}
}
