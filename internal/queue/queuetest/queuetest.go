// Package queuetest gives a test the PostgreSQL queue on a table of its own
// in the test database: the fixture the queue's and the dispatcher's tests
// share.
package queuetest

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	pgqueue "github.com/webhook-idempotency/caddy-webhook-idempotency/internal/queue/postgres"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
	pgstore "github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store/postgres"
)

// DefaultDSN is the test database used when TEST_DATABASE_URL is unset.
const DefaultDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// DSN returns TEST_DATABASE_URL, else DefaultDSN.
func DSN() string {
	if dsn := os.Getenv("TEST_DATABASE_URL"); dsn != "" {
		return dsn
	}
	return DefaultDSN
}

// Table is a store and its queue on a fresh events table.
type Table struct {
	Store *pgstore.Store
	Queue *pgqueue.Queue
	Name  string // the events table: prefix + a random token
}

// New opens a store (opts, with DSN and Table filled in when empty) and its
// queue (qopts) on a fresh table named prefix + 12 random characters, and
// closes the queue and drops the table, its queue and attempts tables and
// their goose histories when the test ends. An unreachable server fails
// the test, or skips it under -short.
func New(t testing.TB, prefix string, opts pgstore.Options, qopts pgqueue.Options) *Table {
	t.Helper()
	if opts.DSN == "" {
		opts.DSN = DSN()
	}
	if opts.Table == "" {
		opts.Table = prefix + store.NewToken()[:12]
	}
	table := opts.Table
	var q *pgqueue.Queue
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := pgstore.New(ctx, opts)
	if err != nil {
		if testing.Short() {
			t.Skipf("PostgreSQL unreachable, skipped under -short: %v", err)
		}
		t.Fatalf("PostgreSQL unreachable (set TEST_DATABASE_URL): %v", err)
	}
	t.Cleanup(func() {
		if q != nil {
			q.Close()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = pgqueue.Drop(ctx, s.Pool(), s.Table())
		_ = s.Close()
	})
	q, err = pgqueue.New(ctx, s, qopts)
	require.NoError(t, err)
	return &Table{Store: s, Queue: q, Name: table}
}
