package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestHelpUnchanged pins what people read: the subcommand list, every
// subcommand's flags, the answer to an unknown subcommand and to a bare
// `provider` (no hypervisor to manage), byte for
// byte as testdata/help holds them (captured from the build before the
// hypervisors became plug-ins; the help texts that enumerate them are
// now built from the registry, and must still read the same).
func TestHelpUnchanged(t *testing.T) {
	for _, tt := range []struct {
		file string
		args []string
	}{
		{"help.txt", []string{"help"}},
		{"noargs.txt", nil}, // serve without flags: the configuration error
		{"serve-h.txt", []string{"serve", "-h"}},
		{"plan-h.txt", []string{"plan", "-h"}},
		{"history-h.txt", []string{"history", "-h"}},
		{"pvesim-h.txt", []string{"pve-sim", "-h"}},
		{"nosuch.txt", []string{"nosuch"}},
	} {
		t.Run(tt.file, func(t *testing.T) {
			want, err := os.ReadFile(filepath.Join("testdata", "help", tt.file))
			if err != nil {
				t.Fatal(err)
			}
			stdout, stderr, _ := runArgs(t, tt.args...)
			if diff := cmp.Diff(string(want), stdout+stderr); diff != "" {
				t.Errorf("provider %q (-want +got):\n%s", tt.args, diff)
			}
		})
	}
}

// TestConfigErrorsUnchanged pins what `provider serve` answers to bad
// flags of every kind (each hypervisor's, the choice between them, the
// core's), byte for byte as testdata/help/errors.json holds them
// (captured from the build before the hypervisors became plug-ins).
func TestConfigErrorsUnchanged(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "help", "errors.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cases []struct {
		Args   []string `json:"args"`
		Output string   `json:"output"`
		Code   int      `json:"code"`
	}
	if err := json.Unmarshal(data, &cases); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		stdout, stderr, code := runArgs(t, append([]string{"serve"}, c.Args...)...)
		if diff := cmp.Diff(c.Output, stdout+stderr); diff != "" || code != c.Code {
			t.Errorf("provider serve %q: exit %d, want %d (-want +got):\n%s", c.Args, code, c.Code, diff)
		}
	}
}
