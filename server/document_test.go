package server

import (
	"errors"
	"strings"
	"testing"

	"github.com/bigfleet-vm/provider/desired"
)

// A term whose guard fails (its lease deadline passed, e.g. while the
// process was paused) serves nothing, even before the replica's timers
// took it down: Document answers as a standby.
func TestDocumentRefusesAnEndedTerm(t *testing.T) {
	doc := &desired.Document{}
	var ended error
	p := &Provider{ha: &replica{}}
	leader := "other:9000"
	p.ha.leader.Store(&leader)
	p.cur.Store(&term{doc: doc, guard: func() error { return ended }})

	if got, err := p.Document(); err != nil || got != doc {
		t.Fatalf("while the term holds: %v, %v; want the document", got, err)
	}
	ended = errors.New("not the leader: no lease keepalive acknowledged in time")
	got, err := p.Document()
	var de *desired.Error
	if got != nil || !errors.As(err, &de) || de.Code != desired.CodeUnavailable || !strings.Contains(de.Msg, "standby") {
		t.Fatalf("after the term ended: %v, %v; want no document and the standby's Unavailable", got, err)
	}
}

// A standby never names itself as the leader: after stepping down, and
// while etcd cannot be read, the last leader it saw is itself.
func TestStandbyNeverNamesItself(t *testing.T) {
	for _, tc := range []struct{ leader, want string }{
		{"other:9000", `this replica is a standby; the leader is "other:9000"`},
		{"self:9000", "this replica is a standby and no leader is elected yet; retry shortly"},
		{"", "this replica is a standby and no leader is elected yet; retry shortly"},
	} {
		r := &replica{self: "self:9000"}
		r.leader.Store(&tc.leader)
		var de *desired.Error
		if err := r.standbyError(); !errors.As(err, &de) || de.Code != desired.CodeUnavailable || de.Msg != tc.want {
			t.Errorf("leader %q: %v, want Unavailable %q", tc.leader, err, tc.want)
		}
	}
}
