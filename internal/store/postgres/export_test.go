package postgres

import "github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"

// Driver returns a second driver on s's pool and table, for tests that
// wrap the driver a store's statements are run with.
func Driver(s *Store) store.Driver {
	return driver{db: s.pool, q: &s.q, pool: s.pool, run: s.DeliveryRunner(), slow: s.slow}
}
