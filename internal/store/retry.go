package store

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"
)

// Errors a driver returns for failures that say nothing about the event:
// the statement may be run again. Callers branch with errors.Is.
var (
	// ErrConnectionLost: the statement's connection broke before its
	// result was known (closed, reset, refused, or no answer within the
	// driver's statement deadline while the caller still waited), so it
	// may or may not have taken effect. A claim tries once more, on
	// another connection, with the same token (see Rules.Claim), and so
	// does a settle (Rules.Complete, Release, Hold).
	ErrConnectionLost = errors.New("database connection lost")
	// ErrTxConflict: the database rolled the transaction back to keep
	// transactions serializable (SQLSTATE 40001 serialization_failure,
	// 40P01 deadlock_detected); nothing of it took effect. Drivers run
	// such a transaction again, at most MaxTxRetries times, before
	// returning it.
	ErrTxConflict = errors.New("transaction rolled back by a conflict (serialization failure or deadlock)")
)

// Reasons a store operation was run again, as RetryObserver receives them.
const (
	RetrySerialization = "serialization_failure" // SQLSTATE 40001
	RetryDeadlock      = "deadlock"              // SQLSTATE 40P01
	RetryConnection    = "connection_lost"       // ErrConnectionLost: a claim or settle, once, on another connection
)

// RetryObserver is told each time a store operation is run again, with one
// of the Retry* reasons. It must be quick; nil observes nothing.
type RetryObserver func(reason string)

// MaxTxRetries bounds how often a driver runs a transaction again after
// ErrTxConflict: 8 more runs, the waits between them growing from 2ms to
// 256ms (about 0.5s in all, plus jitter), or until the caller's context
// ends.
const MaxTxRetries = 8

// TxBackoff is the wait before retry n (0-based) of a rolled-back
// transaction: 2ms doubling up to 256ms, with up to 50% jitter so that the
// transactions that conflicted do not meet again.
func TxBackoff(n int) time.Duration {
	d := 2 * time.Millisecond << min(n, 7)
	return d/2 + rand.N(d/2+1) // #nosec G404 -- jitter, not a secret
}

// Sleep waits d or until ctx ends, and reports whether it waited all of d.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
