package sqlite

import (
	"database/sql"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// DB returns the underlying database, for the tests' PRAGMA checks.
func (s *Store) DB() *sql.DB { return s.db }

// BatchDriver returns a second driver on s's database and table, for
// tests that wrap the driver a store's batches are written with.
func BatchDriver(s *Store) store.BatchDriver { return driver{db: s.db, q: &s.q} }
