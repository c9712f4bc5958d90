//go:build !unix

package spool

import "os"

// lockDir takes no lock where flock is missing: on such systems, giving
// each gateway process its own spool directory is the operator's duty
// (the README says so).
func lockDir(string) (*os.File, error) { return nil, nil }

func unlockDir(f *os.File) error {
	if f == nil {
		return nil
	}
	return f.Close()
}
