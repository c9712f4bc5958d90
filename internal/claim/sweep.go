package claim

import (
	"cmp"
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// Defaults of a Sweeper.
const (
	// DefaultSweepBatch is the most rows one retention statement deletes.
	// A sweep runs as many statements as it takes to leave nothing expired
	// (store.Sweep).
	DefaultSweepBatch = 1000
)

// Sweeper deletes a route's expired rows: events older than their
// retention, body hashes older than the replay window. Any instance may
// run it; batches don't conflict.
type Sweeper struct {
	// Store holds the rows. Required.
	Store store.Store
	// Expiries says, as of now, which scopes' rows expire before when.
	// Required.
	Expiries func(now time.Time) []store.Expiry
	// Every is how often Run sweeps. Required.
	Every time.Duration
	// Batch and StoreTimeout: DefaultSweepBatch and DefaultStoreTimeout
	// when zero.
	Batch        int
	StoreTimeout time.Duration
	// Logger receives failed sweeps. Default: zap.NewNop().
	Logger *zap.Logger
}

// Run sweeps every Every until ctx ends.
func (s *Sweeper) Run(ctx context.Context) {
	t := time.NewTicker(s.Every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := s.Once(ctx, time.Now()); err != nil && s.Logger != nil {
			s.Logger.Warn("retention sweep failed", zap.Error(err))
		}
	}
}

// Once runs one sweep as of now, in batches until nothing expired is left
// (store.Sweep), and returns how many rows it deleted.
func (s *Sweeper) Once(ctx context.Context, now time.Time) (int, error) {
	return store.Sweep(ctx, s.Store, s.Expiries(now), cmp.Or(s.Batch, DefaultSweepBatch),
		cmp.Or(s.StoreTimeout, DefaultStoreTimeout))
}
