// Package sqlite is the embedded implementation of store.Store, on
// modernc.org/sqlite (pure Go, no cgo). It is meant for a single gateway
// instance: the database file is in WAL mode and this process writes
// through one connection, so concurrent claims queue instead of failing with
// SQLITE_BUSY. Times are stored as Unix milliseconds, and lease expiry is
// judged by SQLite's clock inside each statement, mirroring the postgres
// store.
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/pressly/goose/v3"
	_ "modernc.org/sqlite" // registers the "sqlite" driver

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// busyTimeoutMillis is how long a statement waits for another process's
// lock on the file before failing.
const busyTimeoutMillis = 10000

// Options configure New. Zero values mean the documented defaults.
type Options struct {
	// Path is the database file. Required. Its parent directory is created
	// (mode 0700) when missing.
	Path string
	// Table is the events table, a lowercase SQL identifier
	// ([a-z_][a-z0-9_]*, at most 40 bytes, no schema). The migration
	// history lives next to it in <table>_goose_version. Defaults to
	// store.DefaultTable ("webhook_events"); see store.ParseTable.
	Table string
	// Logger receives the migration log. Nil discards it.
	Logger *slog.Logger
	// Batch configures group commit: concurrent claims, completes and
	// releases are written in one transaction (one commit, one fsync) per
	// batch. See store.BatchOptions.
	Batch store.BatchOptions
}

// Store is a store.Store backed by an SQLite file: store.Rules over this
// package's driver. It is safe for concurrent use.
type Store struct {
	store.Rules
	db    *sql.DB
	table string
	q     queries
	sq    secretQueries
}

var _ store.Store = (*Store)(nil)

// New opens (creating if needed) the database file at opts.Path in WAL mode
// with a busy timeout, and creates or migrates the events table with goose.
// It returns an error for an empty path, an invalid table name, a file that
// cannot be opened or created, or a failed migration.
func New(ctx context.Context, opts Options) (*Store, error) {
	if opts.Path == "" {
		return nil, errors.New("sqlite: path is required")
	}
	table, err := store.ParseTable(opts.Table)
	if err != nil {
		return nil, fmt.Errorf("sqlite: %w", err)
	}
	if table.Schema != "" {
		return nil, fmt.Errorf("sqlite: invalid table name %q: SQLite tables take no schema", opts.Table)
	}
	opts.Table = table.Name
	path, err := filepath.Abs(opts.Path)
	if err != nil {
		return nil, fmt.Errorf("sqlite: resolving path: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("sqlite: creating directory: %w", err)
	}

	// The file holds event IDs and stored upstream answers: readable by
	// Caddy's user only, as the spool's files are. SQLite would create it
	// with the process's umask (0644 as a rule); its -wal and -shm files
	// take the database file's mode.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600) //nolint:gosec // the configured database path
	if err != nil {
		return nil, fmt.Errorf("sqlite: opening %s: %w", path, err)
	}
	_ = f.Close()
	if err := closeToOthers(path, path+"-wal", path+"-shm"); err != nil {
		return nil, err
	}
	db, err := sql.Open("sqlite", dsn(path))
	if err != nil {
		return nil, fmt.Errorf("sqlite: opening %s: %w", path, interpretError(err))
	}
	// One connection: SQLite has a single writer anyway, and queuing in
	// database/sql (which honours contexts) beats SQLITE_BUSY. Keep it open
	// for good so its pragmas and the WAL stay in place.
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxLifetime(0)
	db.SetConnMaxIdleTime(0)

	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("sqlite: opening %s: %w", path, interpretError(err))
	}
	s := &Store{db: db, table: opts.Table, q: buildQueries(quoteIdent(opts.Table)), sq: buildSecretQueries(opts.Table)}
	d := driver{db: db, q: &s.q}
	s.Rules = store.NewRules(d)
	if err := s.migrate(ctx, opts); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("sqlite: migrating table %s: %w", opts.Table, interpretError(err))
	}
	if d.prepared, err = d.prepare(ctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("sqlite: preparing statements: %w", interpretError(err))
	}
	s.Rules = store.NewBatchedRules(d, opts.Batch)
	return s, nil
}

// dsn builds the modernc.org/sqlite DSN: a file: URI, so any path works,
// with the pragmas every connection needs. Transactions begin IMMEDIATE so
// they take the write lock up front instead of failing to upgrade it.
func dsn(path string) string {
	u := url.URL{Scheme: "file", Path: filepath.ToSlash(path)}
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", busyTimeoutMillis))
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(FULL)")
	q.Add("_txlock", "immediate")
	return u.String() + "?" + q.Encode()
}

// quoteIdent quotes a validated identifier.
func quoteIdent(name string) string { return `"` + name + `"` }

// migrateMu serialises migrations within the process: goose has no lock for
// SQLite, and stores opened together on one file would otherwise both apply
// the same version.
var migrateMu sync.Mutex

// migrate creates or upgrades the table with goose (dialect sqlite3), with
// the history in <table>_goose_version. Within a process, migrations run
// one at a time. Across processes (not the intended setup) each migration
// transaction begins IMMEDIATE and waits on the busy timeout, but two
// processes may both apply a version: keep every migration idempotent.
func (s *Store) migrate(ctx context.Context, opts Options) error {
	migrateMu.Lock()
	defer migrateMu.Unlock()

	options := []goose.ProviderOption{
		goose.WithTableName(s.table + "_goose_version"),
		goose.WithGoMigrations(migrations(s.table)...),
		goose.WithDisableGlobalRegistry(true),
	}
	if opts.Logger != nil {
		options = append(options, goose.WithSlog(opts.Logger))
	} else {
		options = append(options, goose.WithLogger(goose.NopLogger()))
	}
	provider, err := goose.NewProvider(goose.DialectSQLite3, s.db, nil, options...)
	if err != nil {
		return fmt.Errorf("setting up goose: %w", err)
	}
	if _, err = provider.Up(ctx); err != nil {
		return err
	}
	// The learned-secrets table has a history of its own (secrets.go).
	options[0] = goose.WithTableName(s.table + "_secrets_goose_version")
	options[1] = goose.WithGoMigrations(secretMigrations(s.table)...)
	provider, err = goose.NewProvider(goose.DialectSQLite3, s.db, nil, options...)
	if err != nil {
		return fmt.Errorf("setting up goose: %w", err)
	}
	_, err = provider.Up(ctx)
	return err
}

// migrations are goose Go migrations because the table name is
// configurable. Append new versions, idempotent ones (see migrate); never
// edit a released one.
func migrations(table string) []*goose.Migration {
	t := quoteIdent(table)
	return []*goose.Migration{
		goose.NewGoMigration(1,
			&goose.GoFunc{RunTx: execAll(
				// Times are Unix milliseconds.
				`CREATE TABLE IF NOT EXISTS `+t+` (
					scope        TEXT    NOT NULL,
					event_id     TEXT    NOT NULL,
					state        TEXT    NOT NULL
						CHECK (state IN ('processing', 'completed', 'released', 'held')),
					token        TEXT    NOT NULL DEFAULT '',
					attempts     INTEGER NOT NULL DEFAULT 1,
					lease_until  INTEGER,
					first_seen   INTEGER NOT NULL,
					updated_at   INTEGER NOT NULL,
					completed_at INTEGER,
					status       INTEGER NOT NULL DEFAULT 0,
					PRIMARY KEY (scope, event_id)
				) WITHOUT ROWID`,
				`CREATE INDEX IF NOT EXISTS `+quoteIdent(table+"_first_seen_idx")+` ON `+t+` (first_seen)`,
				`CREATE INDEX IF NOT EXISTS `+quoteIdent(table+"_state_updated_at_idx")+` ON `+t+` (state, updated_at)`,
			)},
			&goose.GoFunc{RunTx: execAll(`DROP TABLE IF EXISTS ` + t)},
		),
		// Retention is per scope (DeleteBefore takes the route's scopes), so
		// its index leads with the scope.
		goose.NewGoMigration(2,
			&goose.GoFunc{RunTx: execAll(
				`CREATE INDEX IF NOT EXISTS `+quoteIdent(table+"_scope_first_seen_idx")+` ON `+t+` (scope, first_seen)`,
				`DROP INDEX IF EXISTS `+quoteIdent(table+"_first_seen_idx"),
			)},
			&goose.GoFunc{RunTx: execAll(
				`CREATE INDEX IF NOT EXISTS `+quoteIdent(table+"_first_seen_idx")+` ON `+t+` (first_seen)`,
				`DROP INDEX IF EXISTS `+quoteIdent(table+"_scope_first_seen_idx"),
			)},
		),
		// Stored responses (replay response, Idempotency-Key mode) and the
		// request fingerprint of a claim, as in the postgres store. SQLite
		// has no ADD COLUMN IF NOT EXISTS: addColumns skips existing ones.
		goose.NewGoMigration(3,
			&goose.GoFunc{RunTx: addColumns(table,
				`fingerprint TEXT NOT NULL DEFAULT ''`,
				`response_headers TEXT`,
				`response_body BLOB`,
				`response_size INTEGER NOT NULL DEFAULT 0`,
				`response_sha256 TEXT NOT NULL DEFAULT ''`,
			)},
			&goose.GoFunc{RunTx: execAll(
				`ALTER TABLE `+t+` DROP COLUMN fingerprint`,
				`ALTER TABLE `+t+` DROP COLUMN response_headers`,
				`ALTER TABLE `+t+` DROP COLUMN response_body`,
				`ALTER TABLE `+t+` DROP COLUMN response_size`,
				`ALTER TABLE `+t+` DROP COLUMN response_sha256`,
			)},
		),
		// Why a held event is held, as in the postgres store.
		goose.NewGoMigration(4,
			&goose.GoFunc{RunTx: addColumns(table, `hold_reason TEXT`)},
			&goose.GoFunc{RunTx: execAll(`ALTER TABLE ` + t + ` DROP COLUMN hold_reason`)},
		),
		// Forwards that ended with no known outcome, as in the postgres store.
		goose.NewGoMigration(5,
			&goose.GoFunc{RunTx: addColumns(table, `ambiguous INTEGER NOT NULL DEFAULT 0`)},
			&goose.GoFunc{RunTx: execAll(`ALTER TABLE ` + t + ` DROP COLUMN ambiguous`)},
		),
		// No (state, updated_at) index, as in the postgres store: every
		// settle moved the row's entry in it (a delete and an insert in a
		// second b-tree); it served only the admin API's listing, which now
		// scans the table.
		goose.NewGoMigration(6,
			&goose.GoFunc{RunTx: execAll(`DROP INDEX IF EXISTS ` + quoteIdent(table+"_state_updated_at_idx"))},
			&goose.GoFunc{RunTx: execAll(
				`CREATE INDEX IF NOT EXISTS ` + quoteIdent(table+"_state_updated_at_idx") + ` ON ` + t + ` (state, updated_at)`,
			)},
		),
	}
}

// addColumns adds each column ("name TYPE ...") the table lacks, so the
// migration stays idempotent (see migrate).
func addColumns(table string, defs ...string) func(context.Context, *sql.Tx) error {
	return func(ctx context.Context, tx *sql.Tx) error {
		for _, def := range defs {
			name, _, _ := strings.Cut(def, " ")
			var n int
			err := tx.QueryRowContext(ctx, `SELECT count(*) FROM pragma_table_info(?1) WHERE name = ?2`, table, name).Scan(&n)
			if err != nil {
				return err
			}
			if n > 0 {
				continue
			}
			if _, err := tx.ExecContext(ctx, `ALTER TABLE `+quoteIdent(table)+` ADD COLUMN `+def); err != nil {
				return err
			}
		}
		return nil
	}
}

func execAll(stmts ...string) func(context.Context, *sql.Tx) error {
	return func(ctx context.Context, tx *sql.Tx) error {
		for _, stmt := range stmts {
			if _, err := tx.ExecContext(ctx, stmt); err != nil {
				return err
			}
		}
		return nil
	}
}

// closeToOthers takes the others' permission bits off each existing file
// of paths: files an earlier version made with the umask's 0644, readable
// by every user of the machine. The group's bits are the operator's choice
// and stay.
func closeToOthers(paths ...string) error {
	for _, p := range paths {
		fi, err := os.Stat(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err == nil && fi.Mode().Perm()&0o007 != 0 {
			err = os.Chmod(p, fi.Mode().Perm()&^0o007)
		}
		if err != nil {
			return fmt.Errorf("sqlite: closing %s to other users: %w", p, err)
		}
	}
	return nil
}
