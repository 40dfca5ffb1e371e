//go:build integration

package libvirt

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/internal/providertest"
)

// env is what scripts/libvirt-up.sh exported ($BIGFLEET_TEST_DIR/env).
type env struct {
	URI, Pool, Pool2, Network, Image, Kernel, Initrd string
}

var (
	// binary is the provider built once by TestMain.
	binary string
	// sub is the substrate; zero when absent (tests skip).
	sub env
	// subErr says why the substrate is unusable ("" when it is usable).
	subErr string
	// logDir keeps the provider logs; removed when every test passed.
	logDir string

	instMu sync.Mutex
	// insts are the installation ids this run used, swept again at exit.
	insts []string
)

// guestCmdline is what the adapter's integration tests boot the tiny guest
// with.
const guestCmdline = "console=ttyS0 quiet panic=-1"

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	sub = env{
		URI: os.Getenv("BIGFLEET_LIBVIRT_URI"), Pool: os.Getenv("BIGFLEET_LIBVIRT_POOL"),
		Pool2: os.Getenv("BIGFLEET_LIBVIRT_POOL2"), Network: os.Getenv("BIGFLEET_LIBVIRT_NETWORK"),
		Image: os.Getenv("BIGFLEET_LIBVIRT_IMAGE"), Kernel: os.Getenv("BIGFLEET_LIBVIRT_KERNEL"),
		Initrd: os.Getenv("BIGFLEET_LIBVIRT_INITRD"),
	}
	var missing []string
	for k, v := range map[string]string{"BIGFLEET_LIBVIRT_URI": sub.URI, "BIGFLEET_LIBVIRT_POOL": sub.Pool,
		"BIGFLEET_LIBVIRT_POOL2": sub.Pool2, "BIGFLEET_LIBVIRT_IMAGE": sub.Image,
		"BIGFLEET_LIBVIRT_KERNEL": sub.Kernel, "BIGFLEET_LIBVIRT_INITRD": sub.Initrd} {
		if v == "" {
			missing = append(missing, k)
		}
	}
	sort.Strings(missing)
	if sub.Network == "" {
		sub.Network = "user"
	}
	switch {
	case len(missing) > 0:
		subErr = "libvirt substrate not configured (" + strings.Join(missing, ", ") +
			" unset): run scripts/libvirt-up.sh and source /var/lib/bigfleet-test/env"
	default:
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		out, err := exec.CommandContext(ctx, "virsh", "-c", sub.URI, "version").CombinedOutput()
		cancel()
		if err != nil {
			subErr = fmt.Sprintf("libvirtd at %s does not answer (virsh version: %v: %s)", sub.URI, err, strings.TrimSpace(string(out)))
		}
		for _, f := range []string{sub.Kernel, sub.Initrd} {
			if _, err := os.Stat(f); err != nil && subErr == "" {
				subErr = "guest artefact missing: " + err.Error()
			}
		}
	}
	if subErr != "" {
		if os.Getenv("CI") == "true" {
			fmt.Fprintln(os.Stderr, "acceptance/libvirt: FATAL (CI=true, not skipping):", subErr)
			return 1
		}
		fmt.Fprintln(os.Stderr, "acceptance/libvirt: skipping:", subErr)
		return m.Run() // every test skips through needSubstrate
	}

	bin, cleanup, err := providertest.Build("bf-acceptance-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "acceptance/libvirt:", err)
		return 1
	}
	defer cleanup()
	binary = bin
	if logDir, err = os.MkdirTemp("", "bf-acceptance-logs-"); err != nil {
		fmt.Fprintln(os.Stderr, "acceptance/libvirt:", err)
		return 1
	}

	code := m.Run()

	// A last sweep for installations whose test cleanup did not run.
	ensureDaemon(nil)
	instMu.Lock()
	for _, inst := range insts {
		if left := sweep(nil, inst); len(left) > 0 {
			fmt.Fprintf(os.Stderr, "acceptance/libvirt: final sweep of %s removed %v\n", inst, left)
		}
	}
	instMu.Unlock()
	if code == 0 {
		os.RemoveAll(logDir)
	} else {
		fmt.Fprintln(os.Stderr, "acceptance/libvirt: provider logs kept in", logDir)
	}
	return code
}

// needSubstrate skips (or, with CI=true, fails; TestMain already exited)
// when the real libvirtd is not usable.
func needSubstrate(t *testing.T) {
	t.Helper()
	if subErr != "" {
		t.Skip(subErr)
	}
}
