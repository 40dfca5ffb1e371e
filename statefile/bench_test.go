package statefile

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// benchValue is a desired-document record of about 300 bytes.
var benchValue = []byte(`{"id":"bf-7q2k","zone":"rack1","offering":"c4m16","state":"IDLE","op":"op-0001",` +
	`"cluster":"prod-eu","shard":"s-17","grace_s":30,"deadline":"2026-11-30T00:00:00Z","labels":{"a":"b"},` +
	`"pad":"` + strings.Repeat("x", 300-196) + `"}`)

// fill writes n records of ~300 bytes without fsync and closes the state.
func fill(b *testing.B, path string, n int, compact bool) {
	b.Helper()
	f := mustOpen(b, path, Options{NoSync: true, CompactBytes: -1})
	var seq uint64
	for i := range n {
		seq = f.Apply(Op{Key: fmt.Sprintf("m/bf-%08d", i), Value: benchValue})
	}
	if err := f.Wait(context.Background(), seq); err != nil {
		b.Fatal(err)
	}
	if compact {
		if err := f.compactNow(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	mustClose(b, f)
}

// BenchmarkApplyWait measures durable mutations per second with 16
// concurrent clients, each doing Apply then Wait, on a real file with
// fsync. The state size must not change the result.
func BenchmarkApplyWait(b *testing.B) {
	for _, size := range []int{0, 100_000} {
		b.Run(fmt.Sprintf("state=%d", size), func(b *testing.B) {
			path := statePath(b)
			if size > 0 {
				fill(b, path, size, true)
			}
			var commits, records atomic.Int64
			var fsyncNanos atomic.Int64
			f := mustOpen(b, path, Options{OnCommit: func(r, _ int, d time.Duration) {
				commits.Add(1)
				records.Add(int64(r))
				fsyncNanos.Add(int64(d))
			}})
			defer mustClose(b, f)
			var id atomic.Int64
			b.SetParallelism((16 + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				client := id.Add(1)
				i := 0
				for pb.Next() {
					seq := f.Apply(Op{Key: fmt.Sprintf("m/c%d-%d", client, i%1000), Value: benchValue})
					if err := f.Wait(context.Background(), seq); err != nil {
						b.Error(err)
						return
					}
					i++
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "mutations/s")
			if c := commits.Load(); c > 0 {
				b.ReportMetric(float64(records.Load())/float64(c), "records/fsync")
				b.ReportMetric(float64(fsyncNanos.Load())/float64(c)/1e6, "ms/fsync")
			}
		})
	}
}

// BenchmarkCommit is BenchmarkApplyWait through Commit: 16 concurrent
// clients, each committing one record and waiting for its callback, on a
// real file with fsync. The state size must not change the result.
func BenchmarkCommit(b *testing.B) {
	for _, size := range []int{0, 100_000} {
		b.Run(fmt.Sprintf("state=%d", size), func(b *testing.B) {
			path := statePath(b)
			if size > 0 {
				fill(b, path, size, true)
			}
			var commits, records atomic.Int64
			var fsyncNanos atomic.Int64
			f := mustOpen(b, path, Options{OnCommit: func(r, _ int, d time.Duration) {
				commits.Add(1)
				records.Add(int64(r))
				fsyncNanos.Add(int64(d))
			}})
			defer mustClose(b, f)
			var id atomic.Int64
			b.SetParallelism((16 + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				client := id.Add(1)
				done := make(chan error, 1)
				ack := func(err error) { done <- err }
				ops := make([]Op, 1)
				i := 0
				for pb.Next() {
					ops[0] = Op{Key: fmt.Sprintf("m/c%d-%d", client, i%1000), Value: benchValue}
					f.Commit(ops, ack)
					if err := <-done; err != nil {
						b.Error(err)
						return
					}
					i++
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "mutations/s")
			if c := commits.Load(); c > 0 {
				b.ReportMetric(float64(records.Load())/float64(c), "records/fsync")
				b.ReportMetric(float64(fsyncNanos.Load())/float64(c)/1e6, "ms/fsync")
			}
		})
	}
}

// BenchmarkOpen measures recovery of 100,000 records of ~300 bytes, from
// a snapshot and from a journal.
func BenchmarkOpen(b *testing.B) {
	for _, from := range []string{"snapshot", "journal"} {
		b.Run(from, func(b *testing.B) {
			path := statePath(b)
			fill(b, path, 100_000, from == "snapshot")
			b.ResetTimer()
			for b.Loop() {
				f, err := Open(path, Options{CompactBytes: -1})
				if err != nil {
					b.Fatal(err)
				}
				if n := len(f.state); n != 100_000 {
					b.Fatalf("recovered %d records", n)
				}
				f.Close()
			}
			b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/open")
		})
	}
}

// BenchmarkReadOnly measures `provider plan`'s read of 100,000 records.
func BenchmarkReadOnly(b *testing.B) {
	path := statePath(b)
	fill(b, path, 100_000, true)
	b.ResetTimer()
	for b.Loop() {
		s, err := ReadOnly(path)
		if err != nil {
			b.Fatal(err)
		}
		if len(s) != 100_000 {
			b.Fatalf("read %d records", len(s))
		}
	}
}

// BenchmarkCompact measures one full compaction of 100,000 records of ~300
// bytes with fsync: clone, snapshot write, renames.
func BenchmarkCompact(b *testing.B) {
	path := statePath(b)
	fill(b, path, 100_000, false)
	f := mustOpen(b, path, Options{CompactBytes: -1})
	defer mustClose(b, f)
	b.ResetTimer()
	for b.Loop() {
		if err := f.compactNow(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(f.snapBytes.Load())/(1<<20), "MiB/snapshot")
}
