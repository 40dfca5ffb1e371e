package e2e

import (
	"strings"
	"testing"

	"github.com/bigfleet-vm/provider/internal/providertest"
)

// Without --use-fake-backend and without a real backend's flags, the
// provider refuses to start and names the flag: the simulator is never
// chosen silently.
func TestBareStartRefusesWithoutFakeBackend(t *testing.T) {
	eachShape(t, func(t *testing.T, sh shape) {
		ports := providertest.FreeAddrs(t, 2)
		out, code := runRaw(t, append([]string{"serve", "--addr", ports[0], "--metrics-addr", ports[1]}, sh.args...)...)
		if code == 0 || !strings.Contains(out, "--use-fake-backend") {
			t.Errorf("exit %d, want non-zero with a message naming --use-fake-backend; output:\n%s", code, out)
		}
	})
}
