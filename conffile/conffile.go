package conffile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
)

// Caps on the files the provider reads (docs/operations.md lists them).
const (
	// MaxJSONBytes caps a JSON configuration file (--offerings,
	// --instance-types).
	MaxJSONBytes = 16 << 20
	// MaxPEMBytes caps a PEM certificate, key or CA bundle.
	MaxPEMBytes = 1 << 20
	// MaxSecretBytes caps a file holding one secret (--proxmox-token-file).
	MaxSecretBytes = 64 << 10
	// MaxUserDataBytes caps the base cloud-init user data
	// (--base-user-data).
	MaxUserDataBytes = 4 << 20
)

// ErrNotRegular is wrapped by the error Read returns for a path that is
// not a regular file.
var ErrNotRegular = errors.New("not a regular file")

// ErrTooLarge is wrapped by the error Read returns for a file over its
// cap.
var ErrTooLarge = errors.New("file too large")

// Read returns the contents of the regular file at path, at most max
// bytes. A path that is not a regular file, or a file larger than max,
// is an error wrapping ErrNotRegular or ErrTooLarge; an error from the
// file system keeps its *fs.PathError (so errors.Is(err,
// fs.ErrNotExist) works).
func Read(path string, max int64) ([]byte, error) {
	// Stat first, so what cannot be opened (a socket) is named too; the
	// open file is checked again, since the path may change in between.
	if st, err := os.Stat(path); err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			pe.Op = "open" // what the caller asked for
		}
		return nil, err
	} else if !st.Mode().IsRegular() {
		return nil, notRegular(path, st.Mode())
	}
	// O_NONBLOCK: opening a FIFO for reading would otherwise wait for a
	// writer. It has no effect on a regular file's reads.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, notRegular(path, st.Mode())
	}
	if st.Size() > max {
		return nil, tooLarge(path, st.Size(), max)
	}
	// The size may be wrong (a file in /proc says 0) or change while it
	// is read: read at most one byte past the cap to tell.
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, &fs.PathError{Op: "read", Path: path, Err: err}
	}
	if int64(len(data)) > max {
		return nil, tooLarge(path, -1, max)
	}
	return data, nil
}

func notRegular(path string, m fs.FileMode) error {
	return fmt.Errorf("%s is %s, %w: name a regular file", path, Kind(m), ErrNotRegular)
}

func tooLarge(path string, size, max int64) error {
	if size < 0 {
		return fmt.Errorf("%s holds more than %s, the cap for this file (%w)", path, human(max), ErrTooLarge)
	}
	return fmt.Errorf("%s is %d bytes, more than %s, the cap for this file (%w)", path, size, human(max), ErrTooLarge)
}

// Kind names what a non-regular file is, with an article ("a character
// device"), for errors that refuse it (config files, the state path).
func Kind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO (named pipe)"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	}
	return "a file of mode " + m.String()
}

// human writes a power-of-two byte count as KiB or MiB.
func human(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}
