package postgres

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/pgschema"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// Executor runs a statement: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type Executor interface {
	Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error)
}

// tableSuffixes name the tables New creates for an events table <table>:
// itself, its migration history, the learned secrets, their enrollment
// windows and their migration history.
var tableSuffixes = []string{"", "_goose_version", "_secrets", "_secrets_enroll", "_secrets_goose_version"}

// Drop removes the store of table from the database: the events table and
// everything New creates next to it (tableSuffixes, <table>_claim and
// <table>_commit). The async queue's tables are its own package's to drop.
// No instance may be using the table: its rows are gone. For tests,
// benchmarks and retiring a table.
func Drop(ctx context.Context, db Executor, table store.Table) error {
	names := make([]string, len(tableSuffixes))
	for i, s := range tableSuffixes {
		names[i] = pgschema.Ident(table.Suffixed(s)).Sanitize()
	}
	if _, err := db.Exec(ctx, `DROP TABLE IF EXISTS `+strings.Join(names, ", ")); err != nil {
		return err
	}
	ident := pgschema.Ident(table)
	_, err := db.Exec(ctx, `DROP FUNCTION IF EXISTS `+claimFunction(ident)+claimFunctionArgs+`, `+
		pgschema.Ident(table.Suffixed("_commit")).Sanitize()+commitFunctionArgs)
	return err
}
