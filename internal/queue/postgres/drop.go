package postgres

import (
	"context"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/pgschema"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
	pgstore "github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store/postgres"
)

// Drop removes the queue of the events table: <table>_queue,
// <table>_attempts and their migration history, and then the store's own
// objects (pgstore.Drop). No instance may be using them. For tests,
// benchmarks and retiring a table.
func Drop(ctx context.Context, db pgstore.Executor, table store.Table) error {
	_, err := db.Exec(ctx, `DROP TABLE IF EXISTS `+
		pgschema.Ident(table.Suffixed("_attempts")).Sanitize()+`, `+
		pgschema.Ident(table.Suffixed("_queue")).Sanitize()+`, `+
		pgschema.Ident(table.Suffixed("_queue_goose_version")).Sanitize())
	if err != nil {
		return err
	}
	return pgstore.Drop(ctx, db, table)
}
