package desired

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/naming"
)

// Open takes the records a warm standby decoded ahead (Options.Decoded)
// instead of decoding those values again, and validates them the same:
// a decoded record the document would never write is refused.
func TestOpenTakesDecodedRecords(t *testing.T) {
	d := open(t, NewMemoryStore(nil), slots(2))
	if _, err := mut(t, d, Request{Kind: KindCreate, MachineID: "z1/kvm.small/000"}); err != nil {
		t.Fatal(err)
	}
	snap, err := d.opts.Store.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	decode := func() map[string]any {
		dec := map[string]any{}
		for k, v := range snap {
			if r := DecodeRecord(k, v); r != nil {
				dec[k] = r
			}
		}
		if len(dec) != 2 {
			t.Fatalf("%d machine records decoded, want 2", len(dec))
		}
		return dec
	}
	reopen := func(dec map[string]any) (*Document, error) {
		d, _, err := Open(context.Background(), Options{Store: NewMemoryStore(snap), DefaultInstallation: "inst", DeleteSupported: true,
			Now: func() time.Time { return t0 }, VMName: naming.VMName, Decoded: func() map[string]any { return dec }}, slots(2))
		return d, err
	}

	// A mark only the decoded record carries shows Open used it.
	dec := decode()
	marker := t0.Add(-time.Hour)
	dec[keyMachine+"z1/kvm.small/001"].(*Machine).Since = marker
	d2, err := reopen(dec)
	if err != nil {
		t.Fatal(err)
	}
	if got := d2.Get("z1/kvm.small/001").Since; !got.Equal(marker) {
		t.Errorf("machine 001 since %v: Open decoded the value again instead of taking the decoded record (%v)", got, marker)
	}
	if got := d2.Get("z1/kvm.small/000").State; got != Creating {
		t.Errorf("machine 000 is %v, want Creating", got)
	}

	dec = decode()
	dec[keyMachine+"z1/kvm.small/000"].(*Machine).State = 99
	if _, err := reopen(dec); err == nil || !strings.Contains(err.Error(), "never writes such a value") {
		t.Errorf("a decoded record with state 99: %v, want it refused", err)
	}
}
