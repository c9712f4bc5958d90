//go:build unix

package spool

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// lockName is the lock file of a spool directory.
const lockName = "LOCK"

// lockDir takes an exclusive flock on dir's lock file, without waiting.
// The kernel releases it when the process dies, kill -9 included, so a
// crashed gateway never leaves its spool locked. The file records the
// holder's PID for the error message of the next process that tries.
func lockDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, lockName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600) //nolint:gosec // the configured spool directory
	if err != nil {
		return nil, fmt.Errorf("spool: opening lock file: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder := ""
		if b, rerr := os.ReadFile(path); rerr == nil && len(b) > 0 { //nolint:gosec // the lock file read back
			holder = " (pid " + strings.TrimSpace(string(b)) + ")"
		}
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%s: %w%s", dir, ErrLocked, holder)
		}
		return nil, fmt.Errorf("spool: locking %s: %w", dir, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}

// unlockDir releases the lock (closing the file drops the flock).
func unlockDir(f *os.File) error {
	if f == nil {
		return nil
	}
	return f.Close()
}
