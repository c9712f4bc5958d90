package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/pressly/goose/v3"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/pgschema"
)

// Migrations are goose Go migrations rather than embedded .sql files because
// the table name is configurable: each statement is built from the validated,
// quoted identifier. Append new versions; never edit a released one.
func migrations(ident pgx.Identifier) []*goose.Migration {
	table := ident.Sanitize()
	name := ident[len(ident)-1]
	idx := func(suffix string) string { return pgx.Identifier{name + suffix}.Sanitize() }
	return []*goose.Migration{
		goose.NewGoMigration(1,
			&goose.GoFunc{RunTx: pgschema.ExecAll(
				`CREATE TABLE IF NOT EXISTS `+table+` (
					scope        text COLLATE "C" NOT NULL,
					event_id     text COLLATE "C" NOT NULL,
					state        text        NOT NULL
						CHECK (state IN ('processing', 'completed', 'released', 'held')),
					token        text        NOT NULL DEFAULT '',
					attempts     integer     NOT NULL DEFAULT 1,
					lease_until  timestamptz,
					first_seen   timestamptz NOT NULL DEFAULT now(),
					updated_at   timestamptz NOT NULL DEFAULT now(),
					completed_at timestamptz,
					status       integer     NOT NULL DEFAULT 0,
					PRIMARY KEY (scope, event_id)
				)`,
				// Retention sweeps (DeleteBefore).
				`CREATE INDEX IF NOT EXISTS `+idx("_first_seen_idx")+` ON `+table+` (first_seen)`,
				// Operator listings (List by state, oldest first).
				`CREATE INDEX IF NOT EXISTS `+idx("_state_updated_at_idx")+` ON `+table+` (state, updated_at)`,
			)},
			&goose.GoFunc{RunTx: pgschema.ExecAll(`DROP TABLE IF EXISTS ` + table)},
		),
		// Retention is per scope (DeleteBefore takes the route's scopes), so
		// its index leads with the scope.
		goose.NewGoMigration(2,
			&goose.GoFunc{RunTx: pgschema.ExecAll(
				`CREATE INDEX IF NOT EXISTS `+idx("_scope_first_seen_idx")+` ON `+table+` (scope, first_seen)`,
				`DROP INDEX IF EXISTS `+schemaIdx(ident, "_first_seen_idx"),
			)},
			&goose.GoFunc{RunTx: pgschema.ExecAll(
				`CREATE INDEX IF NOT EXISTS `+idx("_first_seen_idx")+` ON `+table+` (first_seen)`,
				`DROP INDEX IF EXISTS `+schemaIdx(ident, "_scope_first_seen_idx"),
			)},
		),
		// Stored responses (replay response, Idempotency-Key mode) and the
		// request fingerprint of a claim. response_headers NULL: no stored
		// response; response_body NULL: status and headers only.
		goose.NewGoMigration(3,
			&goose.GoFunc{RunTx: pgschema.ExecAll(
				`ALTER TABLE `+table+` ADD COLUMN IF NOT EXISTS fingerprint text NOT NULL DEFAULT ''`,
				`ALTER TABLE `+table+` ADD COLUMN IF NOT EXISTS response_headers text`,
				`ALTER TABLE `+table+` ADD COLUMN IF NOT EXISTS response_body bytea`,
				`ALTER TABLE `+table+` ADD COLUMN IF NOT EXISTS response_size bigint NOT NULL DEFAULT 0`,
				`ALTER TABLE `+table+` ADD COLUMN IF NOT EXISTS response_sha256 text NOT NULL DEFAULT ''`,
			)},
			&goose.GoFunc{RunTx: pgschema.ExecAll(
				`ALTER TABLE `+table+` DROP COLUMN IF EXISTS fingerprint`,
				`ALTER TABLE `+table+` DROP COLUMN IF EXISTS response_headers`,
				`ALTER TABLE `+table+` DROP COLUMN IF EXISTS response_body`,
				`ALTER TABLE `+table+` DROP COLUMN IF EXISTS response_size`,
				`ALTER TABLE `+table+` DROP COLUMN IF EXISTS response_sha256`,
			)},
		),
		// Why a held event is held (Event.HoldReason). NULL unless held, and
		// for rows held before this version.
		goose.NewGoMigration(4,
			&goose.GoFunc{RunTx: pgschema.ExecAll(
				`ALTER TABLE ` + table + ` ADD COLUMN IF NOT EXISTS hold_reason text`,
			)},
			&goose.GoFunc{RunTx: pgschema.ExecAll(
				`ALTER TABLE ` + table + ` DROP COLUMN IF EXISTS hold_reason`,
			)},
		),
		// How many forwards of the event ended with no known outcome
		// (Event.Ambiguous): released ambiguously, held, or a lease that
		// expired and was taken over.
		goose.NewGoMigration(5,
			&goose.GoFunc{RunTx: pgschema.ExecAll(
				`ALTER TABLE ` + table + ` ADD COLUMN IF NOT EXISTS ambiguous integer NOT NULL DEFAULT 0`,
			)},
			&goose.GoFunc{RunTx: pgschema.ExecAll(
				`ALTER TABLE ` + table + ` DROP COLUMN IF EXISTS ambiguous`,
			)},
		),
		// complete_by upstream: <table>_commit(claim text), which an
		// upstream calls in its own transaction (see commit.go).
		goose.NewGoMigration(6,
			&goose.GoFunc{RunTx: migrateCommit(ident)},
			&goose.GoFunc{RunTx: dropCommit(ident)},
		),
		// Completions as HOT updates: an update that changes no indexed
		// column, and finds room on its row's page, writes no index entry
		// (the heap tuple only, a fraction of the WAL). The (state,
		// updated_at) index made every settle change two indexed columns,
		// so each completion added an entry to all three indexes; it served
		// only the admin API's listing, which now scans the table (an
		// operator's occasional query, bounded by retention). fillfactor
		// leaves a fifth of each new page free for the rows' settles, which
		// follow their inserts by milliseconds; pages written before keep
		// their fill.
		goose.NewGoMigration(7,
			&goose.GoFunc{RunTx: pgschema.ExecAll(
				`DROP INDEX IF EXISTS `+schemaIdx(ident, "_state_updated_at_idx"),
				`ALTER TABLE `+table+` SET (fillfactor = 80)`,
			)},
			&goose.GoFunc{RunTx: pgschema.ExecAll(
				`CREATE INDEX IF NOT EXISTS `+idx("_state_updated_at_idx")+` ON `+table+` (state, updated_at)`,
				`ALTER TABLE `+table+` RESET (fillfactor)`,
			)},
		),
		// Claims through <table>_claim, whose statements PL/pgSQL plans
		// once per connection (see createClaimFunction).
		goose.NewGoMigration(8,
			&goose.GoFunc{RunTx: migrateClaim(ident)},
			&goose.GoFunc{RunTx: dropClaim(ident)},
		),
		// <table>_claim reads a batch's keys in one statement and inserts
		// its new ones in another (see createClaimFunction). Its results
		// are the same as version 8's, so going down keeps it.
		goose.NewGoMigration(9,
			&goose.GoFunc{RunTx: migrateClaim(ident)},
			&goose.GoFunc{RunTx: pgschema.ExecAll()},
		),
		// <table>_claim claims a key given twice in one call once (see
		// createClaimFunction); the store never sends one twice, so going
		// down keeps it.
		goose.NewGoMigration(10,
			&goose.GoFunc{RunTx: migrateClaim(ident)},
			&goose.GoFunc{RunTx: pgschema.ExecAll()},
		),
	}
}

// schemaIdx is the name of the table's index with suffix, qualified with
// the table's schema when it has one (an index lives in its table's schema).
func schemaIdx(ident pgx.Identifier, suffix string) string {
	name := ident[len(ident)-1] + suffix
	if len(ident) == 2 {
		return pgx.Identifier{ident[0], name}.Sanitize()
	}
	return pgx.Identifier{name}.Sanitize()
}

// migrate brings the table to the latest version with goose. The history is
// kept in <table>_goose_version, next to the table. Instances starting
// together are serialised by a session-level advisory lock whose key is
// derived from the schema-qualified table name, so gateways using other
// tables (or an application using goose with its default lock) never wait
// on each other.
func (s *Store) migrate(ctx context.Context, ident pgx.Identifier, opts Options) error {
	qualified, err := pgschema.Qualify(ctx, s.pool, ident)
	if err != nil {
		return err
	}
	return pgschema.Up(ctx, s.pool, pgschema.Migration{
		VersionTable: s.table.String() + "_goose_version",
		LockID:       pgschema.LockID(qualified[0], qualified[1]),
		Migrations:   migrations(ident),
		Timeout:      opts.MigrationTimeout,
		Logger:       opts.Logger,
	})
}
