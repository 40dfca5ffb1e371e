package server

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/config"
	"github.com/bigfleet-vm/provider/desired"
	"github.com/bigfleet-vm/provider/statefile"
)

// TestGracefulStopCommitsHistories: events recorded after the last commit
// (they ride along with the next one) are committed by a graceful stop,
// so only a crash can lose them.
func TestGracefulStopCommitsHistories(t *testing.T) {
	ctx := context.Background()
	state := filepath.Join(t.TempDir(), "state")
	cfg, err := config.Parse(testReg, []string{"--use-fake-backend", "--state", state, "--seed-count", "4", "--addr", "127.0.0.1:0", "--metrics-addr", ""}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	p, err := Build(ctx, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	doc, err := p.Document()
	if err != nil {
		t.Fatal(err)
	}
	id := cfg.Slots[0].ID
	if _, err := doc.Mutate(ctx, desired.Request{Kind: desired.KindCreate, MachineID: id}); err != nil {
		t.Fatal(err)
	}
	doc.Record(id, desired.Event{Kind: desired.EventStep, Action: "clone", Outcome: "ok", DurationMS: 41000})
	p.cur.Load().drain(time.Second, "test stop")
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	stored, err := statefile.ReadOnly(state)
	if err != nil {
		t.Fatal(err)
	}
	hs, err := desired.ReadHistory(stored)
	if err != nil {
		t.Fatal(err)
	}
	evs := hs[id].Events
	if len(evs) != 2 || evs[1].Action != "clone" {
		t.Errorf("history after a graceful stop: %+v", evs)
	}
}
