// Package postgres is the PostgreSQL implementation of store.Store, on a
// pgx/v5 pool. Several gateway instances may share one database: claims are
// decided by the table's primary key in single statements, and lease expiry
// is judged by the database's clock (now()), never the gateway's.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/pgschema"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// DefaultMaxConns is the pool size unless the DSN (pool_max_conns) or
// Options.MaxConns says otherwise. A claim and a settle each wait for a
// commit, which is bound by the WAL flush, not by CPU: with pgx's default of
// max(4, CPUs) connections at most 4 commits were in flight per gateway on a
// 2-core machine, and 32 concurrent deliveries queued for a connection
// twice each (BENCHMARKS.md: 2x the new deliveries per second with 16).
const DefaultMaxConns = 16

// DefaultBatchWriters is how many batches of claims and settles one store
// writes at once unless Options.Batch.Writers says otherwise (see
// store.BatchOptions.Writers). One: in BENCHMARKS.md four writers gave the
// same deliveries per second (1.04x, within the rounds' noise) for 2.7x
// PostgreSQL's CPU and 1.7x the WAL flushes, their batches being smaller.
const DefaultBatchWriters = 1

const (
	defaultConnectTimeout   = 5 * time.Second
	defaultMigrationTimeout = time.Minute
)

// Options configure New. Zero values mean the documented defaults.
type Options struct {
	// DSN is a pgx connection string, URL ("postgres://user:pass@host/db")
	// or key=value form. Required. It is never included in errors: a
	// password in it is redacted. It may name several hosts
	// ("postgres://h1:5432,h2:5432/db?target_session_attrs=read-write"):
	// pgx connects to the first that accepts writes (read-write is implied
	// when several hosts are named), and after a failover the pool drops
	// its connections and finds the new primary (pgschema.PrepareFailover).
	DSN string
	// Table is the events table, optionally schema-qualified
	// ("webhooks.events"); the schema must exist. Each part is a lowercase
	// SQL identifier ([a-z_][a-z0-9_]*), the table part at most 40 bytes.
	// The migration history lives next to it in <table>_goose_version.
	// Defaults to store.DefaultTable ("webhook_events"); see store.ParseTable.
	Table string
	// ConnectTimeout bounds the first connection (the ping in New), so a
	// wrong DSN or a down server fails clearly, and, unless the DSN sets
	// connect_timeout, every connection the pool opens later: dial, TLS
	// and startup handshake, per host of a multi-host DSN. pgxpool lets
	// an opening connection run on after its caller gave up, for up to 2
	// minutes when nothing bounds it, and counts it against the pool's
	// size: behind a load balancer or relay that accepts connections but
	// never answers, the openings of a few seconds' outage held every slot
	// and claims failed for minutes after the server was back. Defaults
	// to 5s.
	ConnectTimeout time.Duration
	// MigrationTimeout bounds waiting for the migration lock (another
	// instance may be migrating) plus running the migrations. Defaults to 1m.
	MigrationTimeout time.Duration
	// MaxConns caps the pool's connections. Defaults to pool_max_conns
	// when the DSN sets it, else to DefaultMaxConns (or the number of CPUs,
	// if larger). Connections are opened on demand.
	MaxConns int32
	// Logger receives the migration log. Nil discards it.
	Logger *slog.Logger
	// Batch configures group commit: concurrent claims, completes and
	// releases are written together, one pipelined transaction (one
	// commit, one WAL flush) per batch. See store.BatchOptions; its
	// Timeout defaults to StatementTimeout here.
	Batch store.BatchOptions
	// StatementTimeout bounds each statement (or batch) of a claim, a
	// settle, a heartbeat or a stored response: one that has no answer in
	// that time is taken for a dead connection (a NAT or load balancer
	// that dropped the flow silently), the pool's connections are dropped,
	// and a claim tries once more on a new one (store.ErrConnectionLost).
	// Defaults to pgschema.DefaultStatementTimeout (2s). Sweeps, listings
	// and migrations have their own bounds.
	StatementTimeout time.Duration
	// Retried is told each time an operation is run again: a transaction
	// the database rolled back for a conflict (SQLSTATE 40001 or 40P01,
	// under SERIALIZABLE or in a deadlock), a claim whose connection was
	// lost. See store.RetryObserver. Nil observes nothing.
	Retried store.RetryObserver
}

// Store is a store.Store backed by PostgreSQL: store.Rules over this
// package's driver. It is safe for concurrent use, also by several
// processes sharing the database.
type Store struct {
	store.Rules
	pool  *pgxpool.Pool
	table store.Table
	q     queries
	sq    secretQueries
	// slow runs the learned secrets' statements; retried is
	// Options.Retried, for the queue on this store's pool.
	slow    pgschema.Runner
	retried store.RetryObserver
	// stmtTimeout and lost are Options.StatementTimeout and the pool's
	// Watch.Lost, for the queue's enqueues (DeliveryRunner).
	stmtTimeout time.Duration
	lost        func()
}

var _ store.Store = (*Store)(nil)

// ErrUnreachable matches (errors.Is) an error of New whose only cause is
// that no server took the connection now (pgschema.Unreachable: refused,
// reset, timed out, starting up, shutting down, out of connections), as
// opposed to a configuration only an operator fixes (a malformed DSN, an
// unknown host, authentication failed, a database that does not exist). A
// caller may try New again later.
var ErrUnreachable = errors.New("postgres: no server reached")

// openError is an error of New: its message (password redacted) and
// whether the server was only unreachable.
type openError struct {
	msg         string
	unreachable bool
}

func (e *openError) Error() string { return e.msg }

func (e *openError) Is(target error) bool { return e.unreachable && target == ErrUnreachable }

// openErr is New's error for cause, worded msg.
func openErr(cause error, msg string) error {
	return &openError{msg: msg, unreachable: pgschema.Unreachable(cause)}
}

// New connects to PostgreSQL, pings it within Options.ConnectTimeout, and
// creates or migrates the events table (see migrate.go), holding a
// PostgreSQL advisory lock so that instances starting together migrate one
// at a time. It returns an error for an empty or malformed DSN, an invalid
// table name, an unreachable server (ErrUnreachable), or a failed migration;
// errors never contain the DSN's password.
func New(ctx context.Context, opts Options) (*Store, error) {
	if opts.DSN == "" {
		return nil, errors.New("postgres: DSN is required")
	}
	table, err := store.ParseTable(opts.Table)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	ident := pgschema.Ident(table)
	if opts.ConnectTimeout <= 0 {
		opts.ConnectTimeout = defaultConnectTimeout
	}
	if opts.MigrationTimeout <= 0 {
		opts.MigrationTimeout = defaultMigrationTimeout
	}

	cfg, err := pgxpool.ParseConfig(opts.DSN)
	if err != nil {
		return nil, fmt.Errorf("parsing postgres DSN: %s", redact(opts.DSN, err.Error()))
	}
	switch {
	case opts.MaxConns > 0:
		cfg.MaxConns = opts.MaxConns
	case !strings.Contains(opts.DSN, "pool_max_conns"):
		cfg.MaxConns = max(cfg.MaxConns, DefaultMaxConns)
	}
	if !strings.Contains(opts.DSN, "default_query_exec_mode") {
		// Each statement is planned for its own parameters (an unnamed
		// prepared statement, its description cached: still one round
		// trip), never with a cached generic plan. A generic plan made
		// while the table was small or never analyzed (autovacuum off, a
		// new table) can pick the (scope, first_seen) index for a lookup by
		// primary key and then read every row of the scope on each claim
		// and completion: measured at one delivery in flight, 24,000 index
		// entries read per delivery after 12,000 deliveries, PostgreSQL's
		// CPU per delivery 3.6 ms instead of 0.3 ms.
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	}
	if opts.StatementTimeout <= 0 {
		opts.StatementTimeout = pgschema.DefaultStatementTimeout
	}
	if cfg.ConnConfig.ConnectTimeout <= 0 {
		cfg.ConnConfig.ConnectTimeout = opts.ConnectTimeout
	}
	watch := pgschema.PrepareFailover(cfg, opts.DSN)
	pgschema.PrepareLiveness(cfg, watch, 0)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("creating postgres pool: %s", redact(opts.DSN, err.Error()))
	}
	watch.Attach(pool)

	pingCtx, cancel := context.WithTimeout(ctx, opts.ConnectTimeout)
	err = pool.Ping(pingCtx)
	cancel()
	if err != nil {
		pool.Close()
		return nil, openErr(err, fmt.Sprintf("connecting to postgres (%s): %s",
			redact(opts.DSN, describeTarget(cfg)), redact(opts.DSN, err.Error())))
	}

	s := &Store{pool: pool, table: table, q: buildQueries(ident), sq: buildSecretQueries(ident),
		retried: opts.Retried, stmtTimeout: opts.StatementTimeout, lost: watch.Lost}
	d := driver{db: pool, q: &s.q, pool: pool,
		run: pgschema.Runner{Timeout: opts.StatementTimeout, Lost: watch.Lost,
			Retries: store.MaxTxRetries, Retried: opts.Retried},
		slow: pgschema.Runner{Retries: store.MaxTxRetries, Retried: opts.Retried}}
	s.slow = d.slow
	s.Rules = store.NewRules(d)
	if err := s.migrate(ctx, ident, opts); err != nil {
		pool.Close()
		return nil, openErr(err, fmt.Sprintf("migrating postgres table %s: %s", table, redact(opts.DSN, err.Error())))
	}
	if err := s.migrateSecrets(ctx, ident, opts); err != nil {
		pool.Close()
		return nil, openErr(err, fmt.Sprintf("migrating postgres table %s_secrets: %s", table, redact(opts.DSN, err.Error())))
	}
	if opts.Batch.Writers <= 0 {
		opts.Batch.Writers = DefaultBatchWriters
	}
	if opts.Batch.Timeout <= 0 {
		// The driver's deadline ends a batch on a dead connection first;
		// this one only bounds the rest.
		opts.Batch.Timeout = 2 * opts.StatementTimeout
	}
	s.Rules = store.NewBatchedRules(d, opts.Batch).WithRetryObserver(opts.Retried)
	return s, nil
}

// Pool returns the store's connection pool, for tests and diagnostics.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Retried returns Options.Retried (nil when unset), so that the queue on
// this store's pool reports its retries the same way.
func (s *Store) Retried() store.RetryObserver { return s.retried }

// DeliveryRunner is the Runner of the store's delivery path (claims,
// settles): Options.StatementTimeout, a statement without an answer in
// that time dropping the pool's connections, conflicts run again. The
// queue's enqueues, the delivery path of async mode, use it too.
func (s *Store) DeliveryRunner() pgschema.Runner {
	return pgschema.Runner{Timeout: s.stmtTimeout, Lost: s.lost, Retries: store.MaxTxRetries, Retried: s.retried}
}

// Table returns the events table name, possibly schema-qualified.
func (s *Store) Table() store.Table { return s.table }

// InTx returns the store's operations within the caller's transaction tx,
// so a caller can claim events together with its own writes (the async
// queue records a delivery's claims and the delivery in one transaction).
// A row a claim conflicts on stays locked until tx ends. Its Close does
// nothing: the caller ends tx, and the pool is the Store's.
func (s *Store) InTx(tx pgx.Tx) store.Store {
	return store.NewRules(driver{db: tx, q: &s.q})
}

// describeTarget names the servers and database for connection errors,
// without the password: every host of a multi-host DSN, once.
func describeTarget(cfg *pgxpool.Config) string {
	c := cfg.ConnConfig
	hosts := []string{fmt.Sprintf("%s:%d", c.Host, c.Port)}
	for _, f := range c.Fallbacks {
		if h := fmt.Sprintf("%s:%d", f.Host, f.Port); !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	return fmt.Sprintf("host=%s user=%s database=%s", strings.Join(hosts, ","), c.User, c.Database)
}
