package termtext

import (
	"testing"
	"time"
)

func TestEscape(t *testing.T) {
	for in, want := range map[string]string{
		"rack1/kvm.small/000": "rack1/kvm.small/000",
		"café":                "café",
		"a\x1b[2Jb":           `"a\x1b[2Jb"`,
		"line\nforged":        `"line\nforged"`,
		"\xff":                `"\xff"`,
		`back\slash`:          `back\slash`,
	} {
		if got := Escape(in); got != want {
			t.Errorf("Escape(%q) = %s, want %s", in, got, want)
		}
	}
}

func TestStamp(t *testing.T) {
	if got := Stamp(time.Time{}); got != "-" {
		t.Errorf("Stamp(zero) = %q", got)
	}
	at := time.Date(2026, 12, 1, 21, 0, 0, 0, time.FixedZone("x", 3600))
	if got := Stamp(at); got != "2026-12-01T20:00:00Z" {
		t.Errorf("Stamp = %q", got)
	}
}
