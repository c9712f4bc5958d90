// Package pgschema holds what the PostgreSQL store and queue share at their
// edge with the database: migrations run with goose under a session advisory
// lock, the table names as identifiers, and the mapping of driver errors to
// plain errors.
package pgschema

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// Migration describes one goose run.
type Migration struct {
	// VersionTable is goose's history table, e.g. "webhook_events_goose_version".
	VersionTable string
	// LockID is the session advisory lock that serialises instances
	// starting together; see LockID.
	LockID int64
	// Migrations are goose Go migrations, in version order.
	Migrations []*goose.Migration
	// Timeout bounds the wait for the lock plus the migrations.
	Timeout time.Duration
	// Logger receives goose's messages; nil discards them.
	Logger *slog.Logger
}

// Up brings the schema to the latest version. Several processes may call it
// at once: the advisory lock (retried every second until Timeout) lets one
// migrate while the others wait, then find nothing to do.
func Up(ctx context.Context, pool *pgxpool.Pool, m Migration) error {
	ctx, cancel := context.WithTimeout(ctx, m.Timeout)
	defer cancel()
	tries := uint64(m.Timeout/time.Second) + 1
	locker, err := lock.NewPostgresSessionLocker(
		lock.WithLockID(m.LockID),
		lock.WithLockTimeout(1, tries),
		lock.WithUnlockTimeout(1, 10),
	)
	if err != nil {
		return err
	}
	db := stdlib.OpenDBFromPool(pool) // closing it leaves the pool open
	defer db.Close()

	options := []goose.ProviderOption{
		goose.WithTableName(m.VersionTable),
		goose.WithSessionLocker(locker),
		goose.WithGoMigrations(m.Migrations...),
		goose.WithDisableGlobalRegistry(true),
	}
	if m.Logger != nil {
		options = append(options, goose.WithSlog(m.Logger))
	} else {
		options = append(options, goose.WithLogger(goose.NopLogger()))
	}
	provider, err := goose.NewProvider(goose.DialectPostgres, db, nil, options...)
	if err != nil {
		return fmt.Errorf("setting up goose: %w", err)
	}
	_, err = provider.Up(ctx)
	return err
}

// ExecAll returns a goose transaction step that runs the statements in
// order.
func ExecAll(stmts ...string) func(context.Context, *sql.Tx) error {
	return func(ctx context.Context, tx *sql.Tx) error {
		for _, stmt := range stmts {
			if _, err := tx.ExecContext(ctx, stmt); err != nil {
				return err
			}
		}
		return nil
	}
}

// Qualify returns ident with its schema: the connection's current schema
// when ident names only a table.
func Qualify(ctx context.Context, pool *pgxpool.Pool, ident pgx.Identifier) (pgx.Identifier, error) {
	if len(ident) != 1 {
		return ident, nil
	}
	var schema string
	if err := pool.QueryRow(ctx, `SELECT COALESCE(current_schema(), '')`).Scan(&schema); err != nil {
		return nil, MapError(err, nil)
	}
	return pgx.Identifier{schema, ident[0]}, nil
}

// LockID derives an advisory lock key from its parts (a purpose and a
// schema-qualified table), so gateways on other tables, or an application
// using goose's default lock, never wait on each other.
func LockID(parts ...string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte("caddy-webhook-idempotency"))
	for _, p := range parts {
		_, _ = h.Write([]byte{0})
		_, _ = h.Write([]byte(p))
	}
	return int64(h.Sum64() & math.MaxInt64)
}

// MapError maps driver errors at a package's edge (River's interpretError):
// pgx.ErrNoRows becomes notFound, context cancellation and deadlines stay
// matchable with errors.Is, and everything else is flattened into a plain
// error, so callers never see pgx.ErrNoRows, *pgconn.PgError or other driver
// types.
func MapError(err, notFound error) error {
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, pgx.ErrNoRows) && notFound != nil:
		return notFound
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("postgres: %w", context.Canceled)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("postgres: %w", context.DeadlineExceeded)
	case errors.As(err, &pgErr):
		return fmt.Errorf("postgres: %s (SQLSTATE %s)", pgErr.Message, pgErr.Code)
	}
	return fmt.Errorf("postgres: %s", err.Error())
}

// Ident is a validated table name as a pgx identifier (quoted when
// sanitized), schema-qualified when t is.
func Ident(t store.Table) pgx.Identifier {
	if t.Schema != "" {
		return pgx.Identifier{t.Schema, t.Name}
	}
	return pgx.Identifier{t.Name}
}
