package deploy_test

import (
	"bytes"
	"debug/elf"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestStaticBuild builds the provider with `make build`, exactly as an
// operator or the Dockerfile's prebuilt target does, and checks that the
// ELF is static (no interpreter, no shared libraries: it runs on
// distroless and scratch) and carries the stamped version.
func TestStaticBuild(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatal("make is not installed")
	}
	bin := filepath.Join(t.TempDir(), "provider")
	cmd := exec.Command("make", "-C", "..", "build", "BIN="+bin, "VERSION=v0.0.0-statictest")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make build: %v\n%s", err, out)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the binary has a PT_INTERP program header: it is dynamically linked and needs a libc loader")
		}
		if p.Type == elf.PT_DYNAMIC {
			t.Error("the binary has a PT_DYNAMIC segment")
		}
	}
	if s := f.Section(".interp"); s != nil {
		t.Error("the binary has an .interp section")
	}
	if libs, err := f.ImportedLibraries(); err != nil || len(libs) > 0 {
		t.Errorf("the binary imports shared libraries %v (%v)", libs, err)
	}

	var out bytes.Buffer
	v := exec.Command(bin, "version")
	v.Stdout = &out
	if err := v.Run(); err != nil {
		t.Fatalf("provider version: %v", err)
	}
	if got, want := strings.TrimSpace(out.String()), "provider v0.0.0-statictest "+runtime.Version(); got != want {
		t.Errorf("provider version printed %q, want %q", got, want)
	}
}
