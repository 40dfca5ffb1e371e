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
