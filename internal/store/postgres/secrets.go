package postgres

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/pressly/goose/v3"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/pgschema"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

var _ store.Secrets = (*Store)(nil)

// secretQueries are the statements of the learned-secrets table,
// <table>_secrets.
type secretQueries struct {
	set, get, forget string
}

func buildSecretQueries(ident pgx.Identifier) secretQueries {
	t := secretsIdent(ident).Sanitize()
	return secretQueries{
		// One statement: the primary key settles concurrent handshakes, and
		// a different stored secret is replaced only when $3 allows it (no
		// row returned: refused). The same secret again keeps its time.
		set: `INSERT INTO ` + t + ` AS s (scope, secret, learned_at) VALUES ($1, $2, now())
			ON CONFLICT (scope) DO UPDATE SET
				secret     = EXCLUDED.secret,
				learned_at = CASE WHEN s.secret = EXCLUDED.secret THEN s.learned_at ELSE EXCLUDED.learned_at END
			WHERE $3::boolean OR s.secret = EXCLUDED.secret
			RETURNING 1`,
		get:    `SELECT scope, secret, learned_at FROM ` + t + ` WHERE scope = $1`,
		forget: `DELETE FROM ` + t + ` WHERE scope = $1`,
	}
}

// secretsIdent is <table>_secrets in the events table's schema.
func secretsIdent(ident pgx.Identifier) pgx.Identifier {
	out := append(pgx.Identifier{}, ident...)
	out[len(out)-1] += "_secrets"
	return out
}

// secretMigrations create the learned-secrets table. They have their own
// history (<table>_secrets_goose_version), apart from the events table's,
// so this table's versions never interleave with the events table's.
// Append new versions; never edit a released one.
func secretMigrations(ident pgx.Identifier) []*goose.Migration {
	t := secretsIdent(ident).Sanitize()
	return []*goose.Migration{
		goose.NewGoMigration(1,
			&goose.GoFunc{RunTx: pgschema.ExecAll(
				`CREATE TABLE IF NOT EXISTS ` + t + ` (
					scope      text COLLATE "C" PRIMARY KEY,
					secret     text        NOT NULL CHECK (secret <> ''),
					learned_at timestamptz NOT NULL DEFAULT now()
				)`,
			)},
			&goose.GoFunc{RunTx: pgschema.ExecAll(`DROP TABLE IF EXISTS ` + t)},
		),
	}
}

// migrateSecrets brings the learned-secrets table to its latest version,
// under an advisory lock of its own (see migrate).
func (s *Store) migrateSecrets(ctx context.Context, ident pgx.Identifier, opts Options) error {
	qualified, err := pgschema.Qualify(ctx, s.pool, ident)
	if err != nil {
		return err
	}
	return pgschema.Up(ctx, s.pool, pgschema.Migration{
		VersionTable: s.table.String() + "_secrets_goose_version",
		LockID:       pgschema.LockID("secrets", qualified[0], qualified[1]),
		Migrations:   secretMigrations(ident),
		Timeout:      opts.MigrationTimeout,
		Logger:       opts.Logger,
	})
}

// SetLearnedSecret implements store.Secrets.
func (s *Store) SetLearnedSecret(ctx context.Context, scope, secret string, replace bool) error {
	if secret == "" {
		return errors.New("storing learned secret: the secret is empty")
	}
	var one int
	err := s.slow.Run(ctx, func(ctx context.Context) error {
		return interpretError(s.pool.QueryRow(ctx, s.sq.set, scope, secret, replace).Scan(&one))
	})
	if errors.Is(err, store.ErrNotFound) {
		return store.ErrSecretExists
	}
	return err
}

// LearnedSecret implements store.Secrets.
func (s *Store) LearnedSecret(ctx context.Context, scope string) (store.LearnedSecret, error) {
	var ls store.LearnedSecret
	err := s.slow.Run(ctx, func(ctx context.Context) error {
		return interpretError(s.pool.QueryRow(ctx, s.sq.get, scope).Scan(&ls.Scope, &ls.Secret, &ls.LearnedAt))
	})
	if err != nil {
		return store.LearnedSecret{}, err
	}
	ls.LearnedAt = ls.LearnedAt.UTC()
	return ls, nil
}

// ForgetLearnedSecret implements store.Secrets.
func (s *Store) ForgetLearnedSecret(ctx context.Context, scope string) error {
	var n int64
	err := s.slow.Run(ctx, func(ctx context.Context) error {
		tag, err := s.pool.Exec(ctx, s.sq.forget, scope)
		n = tag.RowsAffected()
		return interpretError(err)
	})
	if err != nil {
		return err
	}
	if n == 0 {
		return store.ErrNotFound
	}
	return nil
}
