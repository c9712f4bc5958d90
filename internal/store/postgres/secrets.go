package postgres

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pressly/goose/v3"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/pgschema"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

var _ store.Secrets = (*Store)(nil)

// secretQueries are the statements of the learned-secrets table,
// <table>_secrets, and of the enrollment windows, <table>_secrets_enroll.
type secretQueries struct {
	lockWindow, lockSecret, set, closeWindow, get, list, forget, loaded, enroll string
}

func buildSecretQueries(ident pgx.Identifier) secretQueries {
	t := secretsIdent(ident, "_secrets").Sanitize()
	e := secretsIdent(ident, "_secrets_enroll").Sanitize()
	return secretQueries{
		// LearnSecret's transaction: the window's row is locked first, so
		// two handshakes of one scope are judged one after the other.
		lockWindow: `SELECT enroll_until FROM ` + e + ` WHERE scope = $1 FOR UPDATE`,
		lockSecret: `SELECT secret FROM ` + t + ` WHERE scope = $1 FOR UPDATE`,
		set: `INSERT INTO ` + t + ` AS s (scope, secret, learned_at, learned_from, learned_by) VALUES ($1, $2, now(), $3, $4)
			ON CONFLICT (scope) DO UPDATE SET secret = EXCLUDED.secret, learned_at = EXCLUDED.learned_at,
				learned_from = EXCLUDED.learned_from, learned_by = EXCLUDED.learned_by`,
		closeWindow: `UPDATE ` + e + ` SET enroll_until = $2 WHERE scope = $1`,
		get:         `SELECT scope, secret, learned_at, learned_from, learned_by FROM ` + t + ` WHERE scope = $1`,
		list: `SELECT COALESCE(s.scope, e.scope), COALESCE(s.secret, ''), s.learned_at, COALESCE(s.learned_from, ''),
				COALESCE(s.learned_by, ''), e.first_loaded_at, e.enroll_until
			FROM ` + t + ` s FULL JOIN ` + e + ` e ON e.scope = s.scope ORDER BY 1`,
		forget: `DELETE FROM ` + t + ` WHERE scope = $1`,
		// The first load opens the window unless a secret is stored.
		loaded: `INSERT INTO ` + e + ` (scope, first_loaded_at, enroll_until)
			SELECT $1, $2::timestamptz, CASE WHEN EXISTS (SELECT 1 FROM ` + t + ` WHERE scope = $1) THEN NULL ELSE $3::timestamptz END
			ON CONFLICT (scope) DO NOTHING`,
		enroll: `INSERT INTO ` + e + ` (scope, enroll_until) VALUES ($1, $2)
			ON CONFLICT (scope) DO UPDATE SET enroll_until = EXCLUDED.enroll_until`,
	}
}

// secretsIdent is <table><suffix> in the events table's schema.
func secretsIdent(ident pgx.Identifier, suffix string) pgx.Identifier {
	out := append(pgx.Identifier{}, ident...)
	out[len(out)-1] += suffix
	return out
}

// secretMigrations create the learned-secrets tables. They have their own
// history (<table>_secrets_goose_version), apart from the events table's,
// so this table's versions never interleave with the events table's.
// Append new versions; never edit a released one.
func secretMigrations(ident pgx.Identifier) []*goose.Migration {
	t := secretsIdent(ident, "_secrets").Sanitize()
	e := secretsIdent(ident, "_secrets_enroll").Sanitize()
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
		// Where a secret was learned, and the enrollment windows (issue 22).
		goose.NewGoMigration(2,
			&goose.GoFunc{RunTx: pgschema.ExecAll(
				`ALTER TABLE `+t+` ADD COLUMN IF NOT EXISTS learned_from text NOT NULL DEFAULT ''`,
				`ALTER TABLE `+t+` ADD COLUMN IF NOT EXISTS learned_by text NOT NULL DEFAULT ''`,
				`CREATE TABLE IF NOT EXISTS `+e+` (
					scope           text COLLATE "C" PRIMARY KEY,
					first_loaded_at timestamptz,
					enroll_until    timestamptz
				)`,
			)},
			&goose.GoFunc{RunTx: pgschema.ExecAll(
				`DROP TABLE IF EXISTS `+e,
				`ALTER TABLE `+t+` DROP COLUMN IF EXISTS learned_from`,
				`ALTER TABLE `+t+` DROP COLUMN IF EXISTS learned_by`,
			)},
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

// LearnSecret implements store.Secrets.
func (s *Store) LearnSecret(ctx context.Context, l store.Learn) error {
	if l.Secret == "" {
		return errors.New("storing learned secret: the secret is empty")
	}
	// Run again after a conflict, the transaction finds its own secret
	// stored and changes nothing.
	err := s.slow.Run(ctx, func(ctx context.Context) error {
		return interpretLearn(pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			var until *time.Time
			err := interpretError(tx.QueryRow(ctx, s.sq.lockWindow, l.Scope).Scan(&until))
			if err != nil && !errors.Is(err, store.ErrNotFound) {
				return err
			}
			var stored string
			err = interpretError(tx.QueryRow(ctx, s.sq.lockSecret, l.Scope).Scan(&stored))
			switch {
			case err != nil && !errors.Is(err, store.ErrNotFound):
				return err
			case stored == l.Secret:
				return nil
			case until == nil || !until.After(l.Now):
				return store.ErrEnrollmentClosed
			case stored != "" && !l.Replace:
				return store.ErrSecretExists
			}
			if _, err := tx.Exec(ctx, s.sq.set, l.Scope, l.Secret, l.From, l.By); err != nil {
				return err
			}
			_, err = tx.Exec(ctx, s.sq.closeWindow, l.Scope, l.Now)
			return err
		}))
	})
	return err
}

// interpretLearn maps LearnSecret's errors, keeping its refusals.
func interpretLearn(err error) error {
	if errors.Is(err, store.ErrEnrollmentClosed) || errors.Is(err, store.ErrSecretExists) {
		return err
	}
	return interpretError(err)
}

// LearnedSecret implements store.Secrets.
func (s *Store) LearnedSecret(ctx context.Context, scope string) (store.LearnedSecret, error) {
	var ls store.LearnedSecret
	err := s.slow.Run(ctx, func(ctx context.Context) error {
		return interpretError(s.pool.QueryRow(ctx, s.sq.get, scope).Scan(&ls.Scope, &ls.Secret, &ls.LearnedAt, &ls.From, &ls.By))
	})
	if err != nil {
		return store.LearnedSecret{}, err
	}
	ls.LearnedAt = ls.LearnedAt.UTC()
	return ls, nil
}

// LearnedSecrets implements store.Secrets.
func (s *Store) LearnedSecrets(ctx context.Context) ([]store.LearnedSecret, error) {
	var out []store.LearnedSecret
	err := s.slow.Run(ctx, func(ctx context.Context) error {
		out = nil
		rows, err := s.pool.Query(ctx, s.sq.list)
		if err != nil {
			return interpretError(err)
		}
		defer rows.Close()
		for rows.Next() {
			var (
				ls                    store.LearnedSecret
				learned, first, until *time.Time
			)
			if err := rows.Scan(&ls.Scope, &ls.Secret, &learned, &ls.From, &ls.By, &first, &until); err != nil {
				return interpretError(err)
			}
			ls.LearnedAt, ls.FirstLoadedAt, ls.EnrollUntil = utc(learned), utc(first), utc(until)
			out = append(out, ls)
		}
		return interpretError(rows.Err())
	})
	return out, err
}

func utc(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.UTC()
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

// RouteLoaded implements store.Secrets.
func (s *Store) RouteLoaded(ctx context.Context, scope string, now time.Time, window time.Duration) error {
	var until *time.Time
	if window > 0 {
		u := now.Add(window)
		until = &u
	}
	return s.slow.Run(ctx, func(ctx context.Context) error {
		_, err := s.pool.Exec(ctx, s.sq.loaded, scope, now, until)
		return interpretError(err)
	})
}

// Enroll implements store.Secrets.
func (s *Store) Enroll(ctx context.Context, scope string, until time.Time) error {
	return s.slow.Run(ctx, func(ctx context.Context) error {
		_, err := s.pool.Exec(ctx, s.sq.enroll, scope, until)
		return interpretError(err)
	})
}
