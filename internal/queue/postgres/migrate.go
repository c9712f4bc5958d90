package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/pressly/goose/v3"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/pgschema"
)

// migrations create the queue's two tables next to the events table. They
// are goose Go migrations, as the store's are, because the names derive
// from the configurable events table. Append new versions; never edit a
// released one.
func migrations(n names) []*goose.Migration {
	q, a := n.queue.Sanitize(), n.attempts.Sanitize()
	idx := func(suffix string) string { return pgx.Identifier{n.table.Name + suffix}.Sanitize() }
	return []*goose.Migration{
		goose.NewGoMigration(1,
			&goose.GoFunc{RunTx: pgschema.ExecAll(
				// One row per (scope, event ID): the key that makes enqueueing
				// happen at most once. id is the arrival order.
				`CREATE TABLE IF NOT EXISTS `+q+` (
					id               bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
					scope            text COLLATE "C" NOT NULL,
					event_id         text COLLATE "C" NOT NULL,
					state            text        NOT NULL
						CHECK (state IN ('queued', 'delivering', 'delivered', 'dead')),
					order_key        text COLLATE "C",
					method           text        NOT NULL,
					uri              text        NOT NULL,
					header           jsonb       NOT NULL,
					body             bytea,
					attempts         integer     NOT NULL DEFAULT 0,
					round_attempts   integer     NOT NULL DEFAULT 0,
					round_started_at timestamptz NOT NULL DEFAULT now(),
					run_at           timestamptz NOT NULL DEFAULT now(),
					token            text        NOT NULL DEFAULT '',
					lease_until      timestamptz,
					received_at      timestamptz NOT NULL DEFAULT now(),
					updated_at       timestamptz NOT NULL DEFAULT now(),
					delivered_at     timestamptz,
					last_status      integer     NOT NULL DEFAULT 0,
					last_error       text        NOT NULL DEFAULT '',
					PRIMARY KEY (scope, event_id)
				)`,
				// Take: due events in order.
				`CREATE INDEX IF NOT EXISTS `+idx("_queue_ready_idx")+` ON `+q+` (scope, run_at, id) WHERE state = 'queued'`,
				// Take: live deliveries (max_concurrency) and expired leases.
				`CREATE INDEX IF NOT EXISTS `+idx("_queue_lease_idx")+` ON `+q+` (scope, lease_until) WHERE state = 'delivering'`,
				// Take: the head of each order key.
				`CREATE INDEX IF NOT EXISTS `+idx("_queue_order_idx")+` ON `+q+` (scope, order_key, id)
					WHERE order_key IS NOT NULL AND state IN ('queued', 'delivering')`,
				// Listings, stats, retry of dead events.
				`CREATE INDEX IF NOT EXISTS `+idx("_queue_state_idx")+` ON `+q+` (scope, state, id)`,
				// Retention.
				`CREATE INDEX IF NOT EXISTS `+idx("_queue_received_idx")+` ON `+q+` (scope, received_at)`,
				// keep_body.
				`CREATE INDEX IF NOT EXISTS `+idx("_queue_keepbody_idx")+` ON `+q+` (scope, delivered_at)
					WHERE state = 'delivered' AND body IS NOT NULL`,
				// One row per attempt, written when the event is taken and
				// completed when it is settled. Also the log the rate cap counts.
				`CREATE TABLE IF NOT EXISTS `+a+` (
					queue_id    bigint      NOT NULL REFERENCES `+q+` (id) ON DELETE CASCADE,
					attempt     integer     NOT NULL,
					scope       text COLLATE "C" NOT NULL,
					worker      text        NOT NULL DEFAULT '',
					started_at  timestamptz NOT NULL DEFAULT now(),
					finished_at timestamptz,
					duration_us bigint      NOT NULL DEFAULT 0,
					status      integer     NOT NULL DEFAULT 0,
					error       text        NOT NULL DEFAULT '',
					outcome     text        NOT NULL DEFAULT 'delivering'
						CHECK (outcome IN ('delivering', 'delivered', 'retry', 'dead', 'lost', 'released')),
					PRIMARY KEY (queue_id, attempt)
				)`,
				// rate: attempts started in the window.
				`CREATE INDEX IF NOT EXISTS `+idx("_attempts_started_idx")+` ON `+a+` (scope, started_at)`,
			)},
			&goose.GoFunc{RunTx: pgschema.ExecAll(`DROP TABLE IF EXISTS ` + a + `, ` + q)},
		),
	}
}

// migrate brings the queue tables to the latest version with goose. The
// history is kept in <table>_queue_goose_version, apart from the events
// table's, and instances starting together are serialised by a session
// advisory lock of their own (see lockKey), so the queue and the store never
// wait on each other's migrations.
func (q *Queue) migrate(ctx context.Context, opts Options) error {
	qualified, err := pgschema.Qualify(ctx, q.pool, q.names.events)
	if err != nil {
		return err
	}
	return pgschema.Up(ctx, q.pool, pgschema.Migration{
		VersionTable: q.names.table.String() + "_queue_goose_version",
		LockID:       lockKey("migrate", qualified[0], qualified[1]),
		Migrations:   migrations(q.names),
		Timeout:      opts.MigrationTimeout,
		Logger:       opts.Logger,
	})
}
