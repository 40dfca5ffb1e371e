package statefile

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"

	"github.com/bigfleet-vm/provider/retry"
)

// lockFile takes an exclusive flock(2) on f without waiting; ErrLocked
// means another open file description holds it. The lock lives as long as
// f stays open and follows the file across renames.
func lockFile(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var lerr error
	if err := rc.Control(func(fd uintptr) {
		for {
			lerr = syscall.Flock(int(fd), syscall.LOCK_EX|syscall.LOCK_NB)
			if !errors.Is(lerr, syscall.EINTR) {
				return
			}
		}
	}); err != nil {
		return err
	}
	if errors.Is(lerr, syscall.EWOULDBLOCK) {
		return ErrLocked
	}
	return lerr
}

// lockJournals opens the state's existing journals for writing and locks
// each, so that a writer that lost its lock file to rm still keeps every
// other process off the files it writes. A journal that a running writer
// replaced between open and lock is noticed (the path names another file)
// and locked again. Absent journals come back nil.
func lockJournals(p paths) (journal, next *os.File, err error) {
	type held [2]*os.File
	h, err := retry.Value(context.Background(), retry.Relock, func(err error) bool { return errors.Is(err, errReplaced) }, func(context.Context) (held, error) {
		var h held
		release := func() {
			for _, f := range h {
				if f != nil {
					f.Close()
				}
			}
		}
		for i, path := range []string{p.journal, p.next} {
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				release()
				return held{}, fmt.Errorf("open %s: %w", path, err)
			}
			h[i] = f
			if err := lockFile(f); err != nil {
				release()
				if errors.Is(err, ErrLocked) {
					return held{}, fmt.Errorf("journal %s is locked by another writer: %w", path, ErrLocked)
				}
				return held{}, fmt.Errorf("lock %s: %w", path, err)
			}
			same, err := names(path, f)
			if err != nil {
				release()
				return held{}, err
			}
			if !same {
				release()
				return held{}, errReplaced
			}
		}
		return h, nil
	})
	if errors.Is(err, errReplaced) {
		return nil, nil, fmt.Errorf("journals %s kept being replaced while locking them: %w", p.journal, ErrLocked)
	}
	if err != nil {
		return nil, nil, err
	}
	return h[0], h[1], nil
}

// errReplaced is a journal replaced between open and lock: lock again.
var errReplaced = errors.New("journal replaced while locking it")

// names reports whether path still names the open file f.
func names(path string, f *os.File) (bool, error) {
	now, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("stat %s: %w", path, err)
	}
	was, err := f.Stat()
	if err != nil {
		return false, fmt.Errorf("stat %s: %w", path, err)
	}
	return os.SameFile(now, was), nil
}
