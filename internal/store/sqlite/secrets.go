package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/pressly/goose/v3"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

var _ store.Secrets = (*Store)(nil)

// secretQueries are the statements of the learned-secrets table,
// <table>_secrets, and of the enrollment windows, <table>_secrets_enroll.
// Times are Unix milliseconds.
type secretQueries struct {
	window, secret, set, closeWindow, get, list, forget, loaded, enroll string
}

func buildSecretQueries(table string) secretQueries {
	t := quoteIdent(table + "_secrets")
	e := quoteIdent(table + "_secrets_enroll")
	return secretQueries{
		// LearnSecret runs in one (immediate) transaction: the store's one
		// connection serialises handshakes.
		window: `SELECT enroll_until FROM ` + e + ` WHERE scope = ?1`,
		secret: `SELECT secret FROM ` + t + ` WHERE scope = ?1`,
		set: `INSERT INTO ` + t + ` AS s (scope, secret, learned_at, learned_from, learned_by) VALUES (?1, ?2, ` + now + `, ?3, ?4)
			ON CONFLICT (scope) DO UPDATE SET secret = excluded.secret, learned_at = excluded.learned_at,
				learned_from = excluded.learned_from, learned_by = excluded.learned_by`,
		closeWindow: `UPDATE ` + e + ` SET enroll_until = ?2 WHERE scope = ?1`,
		get:         `SELECT scope, secret, learned_at, learned_from, learned_by FROM ` + t + ` WHERE scope = ?1`,
		list: `SELECT s.scope, s.secret, s.learned_at, s.learned_from, s.learned_by, e.first_loaded_at, e.enroll_until
				FROM ` + t + ` s LEFT JOIN ` + e + ` e ON e.scope = s.scope
			UNION ALL
			SELECT e.scope, '', NULL, '', '', e.first_loaded_at, e.enroll_until
				FROM ` + e + ` e WHERE NOT EXISTS (SELECT 1 FROM ` + t + ` s WHERE s.scope = e.scope)
			ORDER BY 1`,
		forget: `DELETE FROM ` + t + ` WHERE scope = ?1`,
		loaded: `INSERT INTO ` + e + ` (scope, first_loaded_at, enroll_until)
			SELECT ?1, ?2, CASE WHEN EXISTS (SELECT 1 FROM ` + t + ` WHERE scope = ?1) THEN NULL ELSE ?3 END
			WHERE true ON CONFLICT (scope) DO NOTHING`,
		enroll: `INSERT INTO ` + e + ` (scope, enroll_until) VALUES (?1, ?2)
			ON CONFLICT (scope) DO UPDATE SET enroll_until = excluded.enroll_until`,
	}
}

// secretMigrations create the learned-secrets tables, with a history of
// their own (<table>_secrets_goose_version). Append new, idempotent
// versions.
func secretMigrations(table string) []*goose.Migration {
	t := quoteIdent(table + "_secrets")
	e := quoteIdent(table + "_secrets_enroll")
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
		// Where a secret was learned, and the enrollment windows (issue 22).
		goose.NewGoMigration(2,
			&goose.GoFunc{RunTx: func(ctx context.Context, tx *sql.Tx) error {
				if err := addColumns(table+"_secrets",
					`learned_from TEXT NOT NULL DEFAULT ''`,
					`learned_by TEXT NOT NULL DEFAULT ''`)(ctx, tx); err != nil {
					return err
				}
				return execAll(`CREATE TABLE IF NOT EXISTS `+e+` (
					scope           TEXT NOT NULL PRIMARY KEY,
					first_loaded_at INTEGER,
					enroll_until    INTEGER
				) WITHOUT ROWID`)(ctx, tx)
			}},
			&goose.GoFunc{RunTx: execAll(
				`DROP TABLE IF EXISTS `+e,
				`ALTER TABLE `+t+` DROP COLUMN learned_from`,
				`ALTER TABLE `+t+` DROP COLUMN learned_by`,
			)},
		),
	}
}

// LearnSecret implements store.Secrets.
func (s *Store) LearnSecret(ctx context.Context, l store.Learn) (err error) {
	if l.Secret == "" {
		return errors.New("storing learned secret: the secret is empty")
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return interpretError(err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
			if !errors.Is(err, store.ErrEnrollmentClosed) && !errors.Is(err, store.ErrSecretExists) {
				err = interpretError(err)
			}
		}
	}()
	var until sql.NullInt64
	if err := tx.QueryRowContext(ctx, s.sq.window, l.Scope).Scan(&until); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	var stored string
	if err := tx.QueryRowContext(ctx, s.sq.secret, l.Scope).Scan(&stored); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	switch {
	case stored == l.Secret:
		return tx.Commit()
	case !until.Valid || until.Int64 <= l.Now.UnixMilli():
		return store.ErrEnrollmentClosed
	case stored != "" && !l.Replace:
		return store.ErrSecretExists
	}
	if _, err := tx.ExecContext(ctx, s.sq.set, l.Scope, l.Secret, l.From, l.By); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, s.sq.closeWindow, l.Scope, l.Now.UnixMilli()); err != nil {
		return err
	}
	return tx.Commit()
}

// LearnedSecret implements store.Secrets.
func (s *Store) LearnedSecret(ctx context.Context, scope string) (store.LearnedSecret, error) {
	var (
		ls store.LearnedSecret
		ms int64
	)
	err := interpretError(s.db.QueryRowContext(ctx, s.sq.get, scope).Scan(&ls.Scope, &ls.Secret, &ms, &ls.From, &ls.By))
	if err != nil {
		return store.LearnedSecret{}, err
	}
	ls.LearnedAt = time.UnixMilli(ms).UTC()
	return ls, nil
}

// LearnedSecrets implements store.Secrets.
func (s *Store) LearnedSecrets(ctx context.Context) ([]store.LearnedSecret, error) {
	rows, err := s.db.QueryContext(ctx, s.sq.list)
	if err != nil {
		return nil, interpretError(err)
	}
	defer rows.Close()
	var out []store.LearnedSecret
	for rows.Next() {
		var (
			ls                    store.LearnedSecret
			learned, first, until sql.NullInt64
		)
		if err := rows.Scan(&ls.Scope, &ls.Secret, &learned, &ls.From, &ls.By, &first, &until); err != nil {
			return nil, interpretError(err)
		}
		ls.LearnedAt, ls.FirstLoadedAt, ls.EnrollUntil = msTime(learned), msTime(first), msTime(until)
		out = append(out, ls)
	}
	return out, interpretError(rows.Err())
}

func msTime(ms sql.NullInt64) time.Time {
	if !ms.Valid {
		return time.Time{}
	}
	return time.UnixMilli(ms.Int64).UTC()
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

// RouteLoaded implements store.Secrets.
func (s *Store) RouteLoaded(ctx context.Context, scope string, now time.Time, window time.Duration) error {
	var until sql.NullInt64
	if window > 0 {
		until = sql.NullInt64{Int64: now.Add(window).UnixMilli(), Valid: true}
	}
	_, err := s.db.ExecContext(ctx, s.sq.loaded, scope, now.UnixMilli(), until)
	return interpretError(err)
}

// Enroll implements store.Secrets.
func (s *Store) Enroll(ctx context.Context, scope string, until time.Time) error {
	_, err := s.db.ExecContext(ctx, s.sq.enroll, scope, until.UnixMilli())
	return interpretError(err)
}
