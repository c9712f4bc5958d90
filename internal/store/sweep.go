package store

import (
	"context"
	"time"
)

// Expiry is one retention rule: rows of Scopes first seen before Cutoff
// are deleted (DeleteBefore's rule: processing rows never are).
type Expiry struct {
	Scopes []string
	Cutoff time.Time
}

// Sweep applies each expiry to s in statements of at most batch rows, at
// most maxBatches statements per expiry, each bounded by timeout. Routes
// keep different kinds of rows for different times: a route's event rows
// for its retention, its body-hash rows (dedupe_body) for its longer
// replay_window. It returns how many rows it deleted and stops at the first
// error.
func Sweep(ctx context.Context, s Store, expiries []Expiry, batch, maxBatches int, timeout time.Duration) (int, error) {
	total := 0
	for _, e := range expiries {
		for range maxBatches {
			dctx, cancel := context.WithTimeout(ctx, timeout)
			n, err := s.DeleteBefore(dctx, e.Scopes, e.Cutoff, batch)
			cancel()
			total += n
			if err != nil {
				return total, err
			}
			if n < batch {
				break
			}
		}
	}
	return total, nil
}
