package conffile

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestRead(t *testing.T) {
	dir := t.TempDir()
	regular := filepath.Join(dir, "offerings.json")
	if err := os.WriteFile(regular, []byte("[1,2,3]"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.json")
	if err := os.Symlink(regular, link); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	for _, tc := range []struct {
		name, path string
		max        int64
		want       string
		wantErr    error  // errors.Is
		wantMsg    string // substring
	}{
		{name: "regular", path: regular, max: 100, want: "[1,2,3]"},
		{name: "symlink to regular", path: link, max: 100, want: "[1,2,3]"},
		{name: "exactly the cap", path: regular, max: 7, want: "[1,2,3]"},
		{name: "over the cap", path: regular, max: 6, wantErr: ErrTooLarge, wantMsg: "is 7 bytes, more than 6 bytes"},
		{name: "/dev/zero", path: "/dev/zero", max: MaxJSONBytes, wantErr: ErrNotRegular, wantMsg: "/dev/zero is a character device"},
		{name: "FIFO", path: fifo, max: MaxJSONBytes, wantErr: ErrNotRegular, wantMsg: "is a FIFO"},
		{name: "socket", path: sock, max: MaxJSONBytes, wantErr: ErrNotRegular, wantMsg: "is a socket"},
		{name: "directory", path: dir, max: MaxJSONBytes, wantErr: ErrNotRegular, wantMsg: "is a directory"},
		{name: "missing", path: filepath.Join(dir, "nope"), max: 10, wantErr: fs.ErrNotExist},
		// A /proc file says its size is 0: the cap still holds.
		{name: "size unknown up front", path: "/proc/self/status", max: 16, wantErr: ErrTooLarge, wantMsg: "holds more than 16 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			type result struct {
				data []byte
				err  error
			}
			done := make(chan result, 1)
			go func() { d, err := Read(tc.path, tc.max); done <- result{d, err} }()
			var r result
			select {
			case r = <-done:
			case <-time.After(30 * time.Second):
				t.Fatalf("Read(%s) has not returned after 30s: it blocks", tc.path)
			}
			if tc.wantErr == nil {
				if r.err != nil {
					t.Fatal(r.err)
				}
				if diff := cmp.Diff(tc.want, string(r.data)); diff != "" {
					t.Errorf("contents (-want +got):\n%s", diff)
				}
				return
			}
			if !errors.Is(r.err, tc.wantErr) {
				t.Fatalf("error %v, want one wrapping %v", r.err, tc.wantErr)
			}
			if !strings.Contains(r.err.Error(), tc.wantMsg) {
				t.Errorf("error %q does not say %q", r.err, tc.wantMsg)
			}
		})
	}
}
