package server

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/bigfleet-vm/provider/config"
	"github.com/bigfleet-vm/provider/desired"
	"github.com/bigfleet-vm/provider/metrics"
)

// handed is a store whose Load returns a document already in memory, the
// way a warm standby's copy reaches a new term.
type handed struct {
	*desired.MemoryStore
	m map[string][]byte
}

func (h handed) Load(context.Context) (map[string][]byte, error) { return h.m, nil }

// BenchmarkOpenTermFromCopy is the provider's own part of a warm
// takeover without etcd: a term opened from a document already in
// memory (decoding and recovering it, opening the simulated world from
// the same keys), at 1,000, 10,000 and 100,000 machines; warm=true
// with a warm copy (desired.Warm) built ahead, as the standby hands it over.
func BenchmarkOpenTermFromCopy(b *testing.B) {
	for _, n := range []int{1000, 10000, 100000} {
		b.Run("machines="+strconv.Itoa(n), func(b *testing.B) {
			cfg, err := config.Parse(testReg, []string{"--use-fake-backend", "--seed-count", strconv.Itoa(n),
				"--state", filepath.Join(b.TempDir(), "state"), "--metrics-addr", ""}, io.Discard)
			if err != nil {
				b.Fatal(err)
			}
			log := slog.New(slog.DiscardHandler)
			ctx := context.Background()
			seed := desired.NewMemoryStore(nil)
			t, err := openTerm(ctx, cfg, log, metrics.New(nil, nil), journaled{seed}, nil, nil)
			if err != nil {
				b.Fatal(err)
			}
			if err := t.close(); err != nil {
				b.Fatal(err)
			}
			snap, err := seed.Load(ctx)
			if err != nil {
				b.Fatal(err)
			}
			for _, pre := range []bool{false, true} {
				b.Run("warm="+strconv.FormatBool(pre), func(b *testing.B) {
					b.ResetTimer()
					for range b.N {
						var warm *standbyCopy
						if pre {
							b.StopTimer()
							slots := desiredSlots(cfg)
							w := desired.NewWarm(slots)
							for k, v := range snap {
								w.Put(k, v)
							}
							w.Settle()
							warm = &standbyCopy{slots: slots, take: func() *desired.Warm { return w }}
							b.StartTimer()
						}
						t, err := openTerm(ctx, cfg, log, metrics.New(nil, nil), journaled{handed{desired.NewMemoryStore(nil), snap}}, nil, warm)
						if err != nil {
							b.Fatal(err)
						}
						b.StopTimer()
						t.close()
						b.StartTimer()
					}
				})
			}
		})
	}
}
