package config

import (
	"io"
	"strings"
	"testing"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt/lvuri"
)

// TestRedactNeverReturnsTheSecret: a URI or URL that does not parse is
// still shown without its password, in the messages of
// --connect and --proxmox-api-url.
func TestRedactNeverReturnsTheSecret(t *testing.T) {
	for _, raw := range []string{
		"qemu+ssh://u:s3cret@h/%zz",
		"qemu+libssh://bigfleet:s3cret@host:port/system",
		"https://root:s3cret@pve/%zz",
		"https://root:s3cret@pve:port/api2/json",
	} {
		if got := hypervisors.RedactURL(raw); strings.Contains(got, "s3cret") {
			t.Errorf("RedactURL(%q) = %q, shows the password", raw, got)
		}
	}
	if _, err := lvuri.ParseConnect("rack1=qemu+ssh://u:s3cret@h/%zz", "local"); err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("ParseConnect: %v, want an error without the password", err)
	}
	if _, err := parse([]string{"--use-fake-backend", "--proxmox-api-url", "https://root:s3cret@pve/%zz"}, io.Discard); err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("--proxmox-api-url: %v, want an error without the password", err)
	}
}
