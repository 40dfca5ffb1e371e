//go:build ha

package ha

// benchStop releases what the benchmarks share (set when they start it).
var benchStop func()

// stopBench is called by TestMain after the run.
func stopBench() {
	if benchStop != nil {
		benchStop()
	}
}
