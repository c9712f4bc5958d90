// Package lease keeps a lease alive while its work runs: the heartbeat of a
// synchronous forward (its claims in the store) and of a queued delivery
// (its lease in the queue), written once.
package lease

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"
)

// minInterval bounds how often a very short lease is renewed.
const minInterval = 10 * time.Millisecond

// Renewal describes one lease to keep alive.
type Renewal struct {
	// Lease is the lease's length. It is renewed every third of it (at
	// least every 10 ms), and each renewal may take a third of it.
	Lease time.Duration
	// Renew extends the lease by Lease, within ctx.
	Renew func(ctx context.Context) error
	// Lost is the error Renew returns (errors.Is) once the lease is gone,
	// e.g. store.ErrLeaseLost: renewing again cannot help.
	Lost error
	// Logger receives failed renewals at Warn, as "renewing <Name>
	// failed" with Fields; never bodies or secrets. Nil discards them.
	Logger *zap.Logger
	Name   string
	Fields []zap.Field
}

// Keep renews r's lease until ctx ends or stop is closed (it returns nil),
// or a renewal reports r.Lost (it returns that error and renews no more).
// Other failures are logged, unless ctx ended meanwhile (the work is
// over), and renewing goes on: a store that comes back in time keeps the
// lease.
func Keep(ctx context.Context, stop <-chan struct{}, r Renewal) error {
	if r.Logger == nil {
		r.Logger = zap.NewNop()
	}
	t := time.NewTicker(max(r.Lease/3, minInterval))
	defer t.Stop()
	for {
		select {
		case <-stop:
			return nil
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, max(r.Lease/3, minInterval))
		err := r.Renew(rctx)
		cancel()
		switch {
		case err == nil:
		case r.Lost != nil && errors.Is(err, r.Lost):
			return err
		case ctx.Err() == nil:
			r.Logger.Warn("renewing "+r.Name+" failed", append(r.Fields[:len(r.Fields):len(r.Fields)], zap.Error(err))...)
		}
	}
}
