package hypervisors

import (
	"errors"
	"fmt"
	"testing"
)

// TestResourceErrors: a hypervisor's out-of-memory or out-of-space text is
// recognised by resource, and a ResourceError is terminal even when its
// cause carries a retryable class (a host that has no room does not get
// room by retrying).
func TestResourceErrors(t *testing.T) {
	for msg, want := range map[string]string{
		"qemu-system-x86_64: cannot set up guest memory 'pc.ram': Cannot allocate memory": "memory",
		"TASK ERROR: out of memory":                                                     "memory",
		"cannot create volume: No space left on device":                                 "disk",
		"not enough space left in storage pool 'default'":                               "disk",
		"storage 'local-lvm' has insufficient space":                                    "disk",
		`Volume group "pve" has insufficient free space (1023 extents): 2048 required.`: "disk",
		"Domain not found: no domain with matching name 'x'":                            "",
		"internal error: process exited while connecting to monitor":                    "",
	} {
		if got := ResourceOf(msg); got != want {
			t.Errorf("ResourceOf(%q) = %q, want %q", msg, got, want)
		}
	}
	err := fmt.Errorf("start: %w", &ResourceError{Resource: "memory", Err: fmt.Errorf("system error: %w", ErrTransient)})
	if Retryable(err) || !errors.Is(err, ErrNoResources) || !errors.Is(err, ErrTransient) {
		t.Errorf("%v: retryable %v, want terminal and both classes in the chain", err, Retryable(err))
	}
}
