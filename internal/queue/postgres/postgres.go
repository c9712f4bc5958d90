// Package postgres is the PostgreSQL implementation of queue.Queue. It lives
// next to the store's events table, on the store's connection pool:
//
//	<table>_queue     one row per (scope, event ID): the request, its state,
//	                  lease and schedule
//	<table>_attempts  one row per delivery attempt: when, by which worker,
//	                  the upstream's status, duration and error
//
// Enqueueing writes the event's claims into <table> (the events table) and
// the request into <table>_queue in one transaction, shared by the
// enqueues of concurrent deliveries (group commit, see Enqueue). Work is
// taken with FOR UPDATE SKIP LOCKED under a per-scope transaction advisory
// lock when a concurrency or rate cap applies, so the caps hold across
// instances; leases are judged by the database's clock.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/coalesce"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/pgschema"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/queue"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
	pgstore "github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store/postgres"
)

const defaultMigrationTimeout = time.Minute

// Options configure New. Zero values mean the documented defaults.
type Options struct {
	// MigrationTimeout bounds waiting for the migration lock plus running
	// the migrations. Defaults to 1m.
	MigrationTimeout time.Duration
	// Logger receives the migration log. Nil discards it.
	Logger *slog.Logger
	// Batch configures group commit of Enqueue. See BatchOptions.
	Batch BatchOptions
}

// Queue is a queue.Queue on PostgreSQL. It does not own its store: the
// caller closes the queue (Close), then the store (and its pool).
type Queue struct {
	store *pgstore.Store
	pool  *pgxpool.Pool
	names names
	sql   queries
	// lockBase is the schema-qualified queue table, the namespace of the
	// queue's advisory lock keys.
	lockBase string
	// batch coalesces enqueues (nil: one transaction each); observe is
	// BatchOptions.Observe.
	batch   *coalesce.Coalescer[*enqueueOp]
	observe func(op string, n int)
	// run runs the delivery path's transactions (enqueues, takes,
	// settles, releases, heartbeats) within the store's statement
	// deadline, and again when rolled back by a conflict (SQLSTATE 40001,
	// 40P01): pgstore.Store.DeliveryRunner.
	run pgschema.Runner
}

var _ queue.Queue = (*Queue)(nil)

// names are the identifiers derived from the events table.
type names struct {
	table    store.Table // the events table
	events   pgx.Identifier
	queue    pgx.Identifier
	attempts pgx.Identifier
}

// New creates or migrates the queue's tables (see migrate.go) next to the
// store's events table, on the store's pool, and returns the queue. The
// queue's tables are named after the events table: <table>_queue,
// <table>_attempts, <table>_queue_goose_version. Claims are recorded
// through the store (InTx), so the events table's rules stay the store's.
func New(ctx context.Context, s *pgstore.Store, opts Options) (*Queue, error) {
	if s == nil {
		return nil, errors.New("postgres queue: no store")
	}
	if opts.MigrationTimeout <= 0 {
		opts.MigrationTimeout = defaultMigrationTimeout
	}
	t := s.Table()
	n := names{
		table:    t,
		events:   pgschema.Ident(t),
		queue:    pgschema.Ident(t.Suffixed("_queue")),
		attempts: pgschema.Ident(t.Suffixed("_attempts")),
	}
	pool := s.Pool()
	q := &Queue{store: s, pool: pool, names: n, sql: buildQueries(n),
		run: s.DeliveryRunner()}
	if err := q.migrate(ctx, opts); err != nil {
		return nil, fmt.Errorf("migrating queue tables of %s: %w", t, err)
	}
	var schema string
	if err := pool.QueryRow(ctx, `SELECT COALESCE(current_schema(), '')`).Scan(&schema); err != nil {
		return nil, interpretError(err)
	}
	if len(n.queue) == 2 {
		schema = n.queue[0]
	}
	q.lockBase = schema + "." + n.queue[len(n.queue)-1]
	q.batch = newBatcher(q, opts.Batch)
	return q, nil
}

// lockKey derives an advisory lock key. Every key of the queue has its own
// prefix, so it never collides with the store's migration lock by design
// (and with an application's keys only by a 2^-63 chance).
func lockKey(parts ...string) int64 {
	return pgschema.LockID(append([]string{"queue"}, parts...)...)
}

func micros(d time.Duration) int64 { return d.Microseconds() }
