package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// DefaultDSN is the test PostgreSQL when TEST_DATABASE_URL is unset.
const DefaultDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// AdminDSN returns $TEST_DATABASE_URL, or DefaultDSN.
func AdminDSN() string {
	if dsn := os.Getenv("TEST_DATABASE_URL"); dsn != "" {
		return dsn
	}
	return DefaultDSN
}

// Database is a PostgreSQL database created for one test or soak run.
type Database struct {
	Name  string
	DSN   string // the admin DSN pointed at this database
	admin string
}

// CreateDatabase creates a database named prefix_<random> with the role of
// adminDSN.
func CreateDatabase(ctx context.Context, adminDSN, prefix string) (*Database, error) {
	u, err := url.Parse(adminDSN)
	if err != nil || u.Scheme == "" {
		return nil, errors.New("e2e: TEST_DATABASE_URL must be a postgres:// URL")
	}
	name := prefix + "_" + RandomHex(6)
	conn, err := pgx.Connect(ctx, adminDSN)
	if err != nil {
		return nil, fmt.Errorf("e2e: connecting to postgres: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return nil, fmt.Errorf("e2e: creating database %s: %w", name, err)
	}
	u.Path = "/" + name
	return &Database{Name: name, DSN: u.String(), admin: adminDSN}, nil
}

// Drop drops the database, closing other sessions on it (WITH (FORCE)).
func (d *Database) Drop(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, d.admin)
	if err != nil {
		return fmt.Errorf("e2e: connecting to postgres: %w", err)
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{d.Name}.Sanitize()+" WITH (FORCE)")
	return err
}

// Row is an event row as the gateway left it in the events table.
type Row struct {
	EventID  string
	State    string
	Attempts int
	Status   int
	Live     bool // processing with a lease still running (database clock)
	// HoldReason is why a held event is held; Ambiguous counts the
	// event's forwards that ended with no known outcome.
	HoldReason string
	Ambiguous  int
}

// Rows reads every row of scope from table (webhook_events when "") in the
// database.
func (d *Database) Rows(ctx context.Context, table, scope string) (map[string]Row, error) {
	if table == "" {
		table = store.DefaultTable
	}
	conn, err := pgx.Connect(ctx, d.DSN)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT event_id, state, attempts, status, COALESCE(lease_until > now(), false),
			COALESCE(hold_reason, ''), ambiguous
		FROM `+pgx.Identifier{table}.Sanitize()+` WHERE scope = $1`, scope)
	if err != nil {
		return nil, err
	}
	out := map[string]Row{}
	for rows.Next() {
		var r Row
		if err := rows.Scan(&r.EventID, &r.State, &r.Attempts, &r.Status, &r.Live, &r.HoldReason, &r.Ambiguous); err != nil {
			rows.Close()
			return nil, err
		}
		out[r.EventID] = r
	}
	return out, rows.Err()
}

// CountByState counts the rows of table per state.
func (d *Database) CountByState(ctx context.Context, table string) (map[string]int, error) {
	if table == "" {
		table = store.DefaultTable
	}
	conn, err := pgx.Connect(ctx, d.DSN)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT state, count(*) FROM `+pgx.Identifier{table}.Sanitize()+` GROUP BY state`)
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for rows.Next() {
		var (
			state string
			n     int
		)
		if err := rows.Scan(&state, &n); err != nil {
			rows.Close()
			return nil, err
		}
		out[state] = n
	}
	return out, rows.Err()
}
