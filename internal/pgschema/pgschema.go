// Package pgschema holds what the PostgreSQL store and queue share at their
// edge with the database: migrations run in one transaction under a
// transaction-scoped advisory lock (safe behind PgBouncer in transaction
// pooling), the table names as identifiers, the mapping of driver errors to
// plain errors, and the pool's connection settings.
package pgschema

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// Migration describes one run of migrations.
type Migration struct {
	// VersionTable is the history table, goose's layout, e.g.
	// "webhook_events_goose_version" or "schema.table_goose_version".
	VersionTable string
	// LockID is the advisory lock that serialises instances starting
	// together; see LockID.
	LockID int64
	// Migrations are goose Go migrations (goose.NewGoMigration) whose up
	// step runs in a transaction (GoFunc.RunTx).
	Migrations []*goose.Migration
	// Timeout bounds the wait for the lock plus the migrations.
	Timeout time.Duration
	// Logger receives a line per migration applied; nil discards them.
	Logger *slog.Logger
}

// Up brings the schema to the latest version. Several processes may call it
// at once: each runs one READ COMMITTED transaction that first takes the
// advisory lock m.LockID with pg_advisory_xact_lock (waiting at most until
// m.Timeout, by lock_timeout), then reads the history and applies what is
// missing, recording each version as goose does, and commits. The winner
// migrates while the others wait, then find nothing to do.
//
// The lock is transaction-scoped, never a session lock: behind PgBouncer in
// transaction pooling a session lock is taken on one server connection and
// released on another (or never), and a process that dies mid-migration
// would strand it; a transaction's lock ends with the transaction, whatever
// happens to the process or the connection. All pending migrations commit
// together or not at all. A migration that cannot run in a transaction
// (CREATE INDEX CONCURRENTLY) has no place here.
//
// The history table keeps goose's layout and meaning (the last row of a
// version says whether it is applied), so tables migrated by earlier
// releases, which ran goose's own runner under a session lock of the same
// key, carry on; during a rolling upgrade both kinds of lock exclude each
// other.
func Up(ctx context.Context, pool *pgxpool.Pool, m Migration) error {
	ctx, cancel := context.WithTimeout(ctx, m.Timeout)
	defer cancel()
	db := stdlib.OpenDBFromPool(pool) // closing it leaves the pool open
	defer db.Close()

	// READ COMMITTED whatever the database's default: the history must be
	// read after the lock is granted, with what the previous holder
	// committed (under REPEATABLE READ or SERIALIZABLE the snapshot would
	// date from before the wait).
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return fmt.Errorf("starting migration transaction: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	if deadline, ok := ctx.Deadline(); ok {
		wait := strconv.FormatInt(max(time.Until(deadline).Milliseconds(), 1), 10) + "ms"
		if _, err := tx.ExecContext(ctx, `SELECT set_config('lock_timeout', $1, true)`, wait); err != nil {
			return fmt.Errorf("bounding the migration lock wait: %w", err)
		}
	}
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, m.LockID); err != nil {
		return fmt.Errorf("taking the migration lock: %w", err)
	}
	hq := newHistoryQueries(versionIdent(m.VersionTable).Sanitize())
	applied, err := appliedVersions(ctx, tx, hq)
	if err != nil {
		return err
	}
	migs := slices.Clone(m.Migrations)
	slices.SortFunc(migs, func(a, b *goose.Migration) int { return cmpInt64(a.Version, b.Version) })
	for _, mig := range migs {
		if applied[mig.Version] {
			continue
		}
		if mig.UpFnContext == nil {
			return fmt.Errorf("migration %d: no transactional up step", mig.Version)
		}
		t0 := time.Now()
		if err := mig.UpFnContext(ctx, tx); err != nil {
			return fmt.Errorf("migration %d: %w", mig.Version, err)
		}
		if _, err := tx.ExecContext(ctx, hq.insert, mig.Version); err != nil {
			return fmt.Errorf("recording migration %d: %w", mig.Version, err)
		}
		if m.Logger != nil {
			m.Logger.Info("migrated", "table", m.VersionTable, "version", mig.Version, "duration", time.Since(t0))
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("committing migrations: %w", err)
	}
	return nil
}

// historyQueries are the statements on a migration history table, goose's
// layout (its PostgreSQL dialect).
type historyQueries struct {
	name, create, insert, list string
}

// newHistoryQueries builds the statements on the quoted table vt.
func newHistoryQueries(vt string) historyQueries {
	return historyQueries{
		name: vt,
		create: `CREATE TABLE ` + vt + ` (
				id integer PRIMARY KEY GENERATED BY DEFAULT AS IDENTITY,
				version_id bigint NOT NULL,
				is_applied boolean NOT NULL,
				tstamp timestamp NOT NULL DEFAULT now()
			)`,
		insert: `INSERT INTO ` + vt + ` (version_id, is_applied) VALUES ($1, true)`,
		// The last row of a version says whether it is applied.
		list: `SELECT DISTINCT ON (version_id) version_id, is_applied FROM ` + vt + ` ORDER BY version_id, id DESC`,
	}
}

// appliedVersions creates the history table when missing (with goose's
// version 0 row) and returns the versions applied: those whose last row
// says so.
func appliedVersions(ctx context.Context, tx *sql.Tx, hq historyQueries) (map[int64]bool, error) {
	var exists bool
	if err := tx.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL`, hq.name).Scan(&exists); err != nil {
		return nil, fmt.Errorf("looking for the migration history: %w", err)
	}
	if !exists {
		if _, err := tx.ExecContext(ctx, hq.create); err != nil {
			return nil, fmt.Errorf("creating the migration history: %w", err)
		}
		if _, err := tx.ExecContext(ctx, hq.insert, 0); err != nil {
			return nil, fmt.Errorf("creating the migration history: %w", err)
		}
	}
	rows, err := tx.QueryContext(ctx, hq.list)
	if err != nil {
		return nil, fmt.Errorf("reading the migration history: %w", err)
	}
	defer rows.Close()
	applied := map[int64]bool{}
	for rows.Next() {
		var (
			v  int64
			ok bool
		)
		if err := rows.Scan(&v, &ok); err != nil {
			return nil, fmt.Errorf("reading the migration history: %w", err)
		}
		applied[v] = ok
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading the migration history: %w", err)
	}
	return applied, nil
}

// versionIdent is a history table's name ("table" or "schema.table") as an
// identifier; its parts are validated table names (store.ParseTable) plus
// a suffix.
func versionIdent(name string) pgx.Identifier {
	if schema, table, ok := strings.Cut(name, "."); ok {
		return pgx.Identifier{schema, table}
	}
	return pgx.Identifier{name}
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
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
// matchable with errors.Is, a transaction rolled back by a conflict
// (SQLSTATE 40001, 40P01) matches store.ErrTxConflict, a broken connection
// (closed, reset, refused, SQLSTATE class 08, a server shutting down)
// store.ErrConnectionLost, and everything else is flattened into a plain
// error, so callers never see pgx.ErrNoRows, *pgconn.PgError or other
// driver types.
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
		switch {
		case pgErr.Code == codeSerialization || pgErr.Code == codeDeadlock:
			return &conflictError{code: pgErr.Code, msg: pgErr.Message}
		case strings.HasPrefix(pgErr.Code, "08") || serverGoneCodes[pgErr.Code] && pgErr.Code != "25006":
			return fmt.Errorf("postgres: %w: %s (SQLSTATE %s)", store.ErrConnectionLost, pgErr.Message, pgErr.Code)
		}
		return fmt.Errorf("postgres: %s (SQLSTATE %s)", pgErr.Message, pgErr.Code)
	case connectionLost(err):
		return fmt.Errorf("postgres: %w: %s", store.ErrConnectionLost, err.Error())
	}
	return fmt.Errorf("postgres: %s", err.Error())
}

// connectionLost reports an error of the connection rather than of the
// statement: nothing was sent, the peer closed or reset it, the dial
// failed.
func connectionLost(err error) bool {
	var (
		netErr  net.Error
		connErr *pgconn.ConnectError
	)
	return pgconn.SafeToRetry(err) || errors.As(err, &netErr) || errors.As(err, &connErr) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// Ident is a validated table name as a pgx identifier (quoted when
// sanitized), schema-qualified when t is.
func Ident(t store.Table) pgx.Identifier {
	if t.Schema != "" {
		return pgx.Identifier{t.Schema, t.Name}
	}
	return pgx.Identifier{t.Name}
}
