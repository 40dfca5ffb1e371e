package cli

import (
	"bytes"
	"context"
	"io"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/config"
	"github.com/bigfleet-vm/provider/plugin"
)

// within runs f and fails the test if it has not returned after 30s.
func within(t *testing.T, what string, f func() int) int {
	t.Helper()
	done := make(chan int, 1)
	go func() { done <- f() }()
	select {
	case code := <-done:
		return code
	case <-time.After(30 * time.Second):
		t.Fatalf("%s has not returned after 30s", what)
		return 0
	}
}

// TestFIFOAsOfferingsFileIsRefused: a FIFO as --offerings used to block
// start-up forever in open(2), deaf to SIGTERM; now it is refused at once
// as a configuration problem.
func TestFIFOAsOfferingsFileIsRefused(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "offerings.json")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	code := within(t, "serve with a FIFO as --offerings", func() int {
		return run(context.Background(), registry(), []string{"--use-fake-backend", "--offerings", fifo, "--metrics-addr", "", "--addr", "127.0.0.1:0"}, io.Discard, &stderr)
	})
	if code != 2 || !strings.Contains(stderr.String(), fifo+" is a FIFO (named pipe), not a regular file") {
		t.Errorf("exit %d, want 2 with the FIFO named:\n%s", code, stderr.String())
	}
}

// TestStuckStartUpObeysTheSignal: a start-up blocked where no signal can
// reach it (here a configuration read that never returns) still ends the
// process once SIGTERM has come and the grace has passed.
func TestStuckStartUpObeysTheSignal(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	defer close(release)
	parseConfig = func(*plugin.Registry, []string, io.Writer) (*config.Config, error) {
		close(entered)
		<-release // a read stuck in a hung file system
		return nil, context.Canceled
	}
	defer func() { <-entered; parseConfig = config.Parse }()
	startupStopGrace = 10 * time.Millisecond
	defer func() { startupStopGrace = 5 * time.Second }()

	ctx, cancel := context.WithCancel(context.Background())
	cancel() // SIGTERM
	var stderr bytes.Buffer
	code := within(t, "serve with a stuck start-up after the signal", func() int { return serve(ctx, registry(), nil, &stderr) })
	if code != 1 || !strings.Contains(stderr.String(), "stopped during start-up") {
		t.Errorf("exit %d, want 1 saying it stopped during start-up:\n%s", code, stderr.String())
	}
}
