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

// Sweep applies each expiry to s in statements of at most batch rows,
// each bounded by timeout, until a statement deletes fewer than batch:
// nothing expired is left, however many rows expired since the last sweep
// (there is no cap per sweep, so the sweep keeps up with any rate of new
// events the database can take). After each full batch it rests as long as
// the batch took (SweepRest): the sweep uses at most half of one
// connection's time, so claims never queue behind a long run of deletes,
// and no statement holds its row locks longer than one batch (the drivers
// skip rows other sessions lock). Routes keep different kinds of rows for
// different times: a route's event rows for its retention, its body-hash
// rows (dedupe_body) for its longer replay_window. It returns how many
// rows it deleted and stops at the first error or when ctx ends.
func Sweep(ctx context.Context, s Store, expiries []Expiry, batch int, timeout time.Duration) (int, error) {
	total := 0
	for _, e := range expiries {
		for {
			t0 := time.Now()
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
			if !Sleep(ctx, SweepRest(time.Since(t0))) {
				return total, ctx.Err()
			}
		}
	}
	return total, nil
}

// SweepRest is the rest after a full batch of a sweep that took took: as
// long again, at most a second.
func SweepRest(took time.Duration) time.Duration { return min(took, time.Second) }
