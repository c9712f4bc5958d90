package sqlite

import (
	"context"
	"errors"
	"time"

	"github.com/pressly/goose/v3"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

var _ store.Secrets = (*Store)(nil)

// secretQueries are the statements of the learned-secrets table,
// <table>_secrets.
type secretQueries struct {
	set, get, forget string
}

func buildSecretQueries(table string) secretQueries {
	t := quoteIdent(table + "_secrets")
	return secretQueries{
		// One statement, as in the postgres store: a different stored secret
		// is replaced only when ?3 allows it (no row returned: refused).
		set: `INSERT INTO ` + t + ` AS s (scope, secret, learned_at) VALUES (?1, ?2, ` + now + `)
			ON CONFLICT (scope) DO UPDATE SET
				secret     = excluded.secret,
				learned_at = CASE WHEN s.secret = excluded.secret THEN s.learned_at ELSE excluded.learned_at END
			WHERE ?3 OR s.secret = excluded.secret
			RETURNING 1`,
		get:    `SELECT scope, secret, learned_at FROM ` + t + ` WHERE scope = ?1`,
		forget: `DELETE FROM ` + t + ` WHERE scope = ?1`,
	}
}

// secretMigrations create the learned-secrets table, with a history of its
// own (<table>_secrets_goose_version). Append new, idempotent versions.
func secretMigrations(table string) []*goose.Migration {
	t := quoteIdent(table + "_secrets")
	return []*goose.Migration{
		goose.NewGoMigration(1,
			&goose.GoFunc{RunTx: execAll(
				// learned_at is Unix milliseconds.
				`CREATE TABLE IF NOT EXISTS ` + t + ` (
					scope      TEXT    NOT NULL PRIMARY KEY,
					secret     TEXT    NOT NULL CHECK (secret <> ''),
					learned_at INTEGER NOT NULL
				) WITHOUT ROWID`,
			)},
			&goose.GoFunc{RunTx: execAll(`DROP TABLE IF EXISTS ` + t)},
		),
	}
}

// SetLearnedSecret implements store.Secrets.
func (s *Store) SetLearnedSecret(ctx context.Context, scope, secret string, replace bool) error {
	if secret == "" {
		return errors.New("storing learned secret: the secret is empty")
	}
	var one int
	err := interpretError(s.db.QueryRowContext(ctx, s.sq.set, scope, secret, replace).Scan(&one))
	if errors.Is(err, store.ErrNotFound) {
		return store.ErrSecretExists
	}
	return err
}

// LearnedSecret implements store.Secrets.
func (s *Store) LearnedSecret(ctx context.Context, scope string) (store.LearnedSecret, error) {
	var (
		ls store.LearnedSecret
		ms int64
	)
	err := interpretError(s.db.QueryRowContext(ctx, s.sq.get, scope).Scan(&ls.Scope, &ls.Secret, &ms))
	if err != nil {
		return store.LearnedSecret{}, err
	}
	ls.LearnedAt = time.UnixMilli(ms).UTC()
	return ls, nil
}

// ForgetLearnedSecret implements store.Secrets.
func (s *Store) ForgetLearnedSecret(ctx context.Context, scope string) error {
	res, err := s.db.ExecContext(ctx, s.sq.forget, scope)
	if err != nil {
		return interpretError(err)
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		if err != nil {
			return interpretError(err)
		}
		return store.ErrNotFound
	}
	return nil
}
