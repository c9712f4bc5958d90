// Package postgres is the PostgreSQL implementation of queue.Queue. It lives
// next to the store's events table, on the store's connection pool:
//
//	<table>_queue     one row per (scope, event ID): the request, its state,
//	                  lease and schedule
//	<table>_attempts  one row per delivery attempt: when, by which worker,
//	                  the upstream's status, duration and error
//
// Enqueueing writes the event's claims into <table> (the events table) and
// the request into <table>_queue in one transaction. Work is taken with
// FOR UPDATE SKIP LOCKED under a per-scope transaction advisory lock when a
// concurrency or rate cap applies, so the caps hold across instances; leases
// are judged by the database's clock.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/pgschema"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/queue"
)

// DefaultTable is the events table used when Options.Table is empty; the
// store's default.
const DefaultTable = "webhook_events"

const defaultMigrationTimeout = time.Minute

// Options configure New. Zero values mean the documented defaults.
type Options struct {
	// Table is the store's events table, optionally schema-qualified; the
	// queue's tables are named after it (<table>_queue, <table>_attempts,
	// <table>_queue_goose_version). It must exist: the store creates it.
	// Each part is a lowercase SQL identifier, the table at most 40 bytes.
	// Defaults to "webhook_events".
	Table string
	// MigrationTimeout bounds waiting for the migration lock plus running
	// the migrations. Defaults to 1m.
	MigrationTimeout time.Duration
	// Logger receives the migration log. Nil discards it.
	Logger *slog.Logger
}

// Queue is a queue.Queue on PostgreSQL. It does not own its pool: the
// caller closes the pool after the last use of the queue.
type Queue struct {
	pool  *pgxpool.Pool
	names names
	sql   queries
	// lockBase is the schema-qualified queue table, the namespace of the
	// queue's advisory lock keys.
	lockBase string
}

var _ queue.Queue = (*Queue)(nil)

// names are the identifiers derived from the events table.
type names struct {
	base     string // the events table's own name, unqualified
	events   pgx.Identifier
	queue    pgx.Identifier
	attempts pgx.Identifier
}

// New creates or migrates the queue's tables (see migrate.go) on pool and
// returns the queue. The events table must already exist.
func New(ctx context.Context, pool *pgxpool.Pool, opts Options) (*Queue, error) {
	if pool == nil {
		return nil, errors.New("postgres queue: no pool")
	}
	if opts.Table == "" {
		opts.Table = DefaultTable
	}
	if opts.MigrationTimeout <= 0 {
		opts.MigrationTimeout = defaultMigrationTimeout
	}
	n, err := parseTable(opts.Table)
	if err != nil {
		return nil, err
	}
	q := &Queue{pool: pool, names: n, sql: buildQueries(n)}
	if err := q.migrate(ctx, opts); err != nil {
		return nil, fmt.Errorf("migrating queue tables of %s: %w", opts.Table, err)
	}
	var schema string
	if err := pool.QueryRow(ctx, `SELECT COALESCE(current_schema(), '')`).Scan(&schema); err != nil {
		return nil, interpretError(err)
	}
	if len(n.queue) == 2 {
		schema = n.queue[0]
	}
	q.lockBase = schema + "." + n.queue[len(n.queue)-1]
	return q, nil
}

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// maxTableLen is the store's limit; it leaves room for the longest derived
// name, <table>_queue_goose_version, within PostgreSQL's 63 bytes.
const maxTableLen = 40

func parseTable(name string) (names, error) {
	schema, table, qualified := strings.Cut(name, ".")
	if !qualified {
		schema, table = "", name
	}
	if !identRE.MatchString(table) || len(table) > maxTableLen ||
		(qualified && (!identRE.MatchString(schema) || len(schema) > 63)) {
		return names{}, fmt.Errorf("postgres queue: invalid table name %q: want [schema.]table, lowercase letters, digits and underscores, the table at most %d bytes", name, maxTableLen)
	}
	ident := func(t string) pgx.Identifier {
		if qualified {
			return pgx.Identifier{schema, t}
		}
		return pgx.Identifier{t}
	}
	return names{base: table, events: ident(table), queue: ident(table + "_queue"), attempts: ident(table + "_attempts")}, nil
}

// lockKey derives an advisory lock key. Every key of the queue has its own
// prefix, so it never collides with the store's migration lock by design
// (and with an application's keys only by a 2^-63 chance).
func lockKey(parts ...string) int64 {
	return pgschema.LockID(append([]string{"queue"}, parts...)...)
}

func micros(d time.Duration) int64 { return d.Microseconds() }
