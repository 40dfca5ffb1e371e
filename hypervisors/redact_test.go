package hypervisors

import (
	"strings"
	"testing"
)

func TestRedactURL(t *testing.T) {
	tests := []struct{ in, want string }{
		{"qemu:///system", "qemu:///system"},
		{"qemu+libssh://bf@host/system?keyfile=/k", "qemu+libssh://bf@host/system?keyfile=/k"},
		{"qemu+ssh://u:s3cret@h/system", "qemu+ssh://u:xxxxx@h/system"},
		// Unparsable: shown as written, without the password.
		{"qemu://host:port/system", "qemu://host:port/system"},
		{"qemu+ssh://u:s3cret@h/%zz", "qemu+ssh://u:xxxxx@h/%zz"},
		{"https://root:s3cret@pve:port/api2/json", "https://root:xxxxx@pve:port/api2/json"},
		{"https://root:s3:cr:et@pve/%zz", "https://root:xxxxx@pve/%zz"},
		{"https://bf@h/%zz", "https://bf@h/%zz"},
		{"https://h/%zz/u:s3cret@x", "https://h/<unparsable URL>"},
		{"u:s3cret@h%zz", "u:<redacted>"},
		{"qemu+ssh:u:s3cret@h/system", "qemu+ssh:<redacted>"},
		{"//u:s3cret@h/%zz", "<unparsable URL>"},
		{"rack1", "rack1"},
	}
	for _, tt := range tests {
		got := RedactURL(tt.in)
		if got != tt.want {
			t.Errorf("RedactURL(%q) = %q, want %q", tt.in, got, tt.want)
		}
		if strings.Contains(got, "s3cret") {
			t.Errorf("RedactURL(%q) = %q shows the password", tt.in, got)
		}
	}
}
