package version

import (
	"runtime"
	"runtime/debug"
	"sync"
)

// stamped is set at link time:
//
//	go build -ldflags "-X github.com/bigfleet-vm/provider/version.stamped=v1.2.3"
var stamped string

var resolved = sync.OnceValue(func() string {
	if stamped != "" {
		return stamped
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "dev"
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev string
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return "dev"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if dirty {
		rev += "-dirty"
	}
	return rev
})

// String returns the provider's version.
func String() string { return resolved() }

// Go returns the Go toolchain version the binary was built with.
func Go() string { return runtime.Version() }
