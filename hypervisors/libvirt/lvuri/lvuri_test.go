package lvuri

import (
	"strings"
	"testing"
)

func TestIsBare(t *testing.T) {
	tests := []struct {
		in   string
		want bool
	}{
		{"qemu:///system", true},
		{"qemu+libssh://u@h/system?keyfile=/k&known_hosts=/kh", true}, // '=' in the query
		{"rack1=qemu:///system", false},
		{"rack1=qemu:///system,rack2=qemu+tls://h/system", false},
	}
	for _, tt := range tests {
		if got := IsBare(tt.in); got != tt.want {
			t.Errorf("IsBare(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}

// Every problem of a --connect list is reported, and none shows a
// password.
func TestParseConnectReportsEverything(t *testing.T) {
	_, err := ParseConnect("a=qemu+tcp://h/system,a=qemu:///system,b,c=qemu+ssh://u:s3cret@h/%zz", "local")
	if err == nil {
		t.Fatal("ParseConnect accepted a bad list")
	}
	for _, want := range []string{`zone "a": URI "qemu+tcp://h/system" uses plain TCP`, `zone "a" is listed twice`, `entry "b" has no '='`, `zone "c": URI "qemu+ssh://u:xxxxx@h/%zz" does not parse`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "s3cret") {
		t.Errorf("error %q shows the password", err)
	}
}
