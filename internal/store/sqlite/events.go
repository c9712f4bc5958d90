package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// now is SQLite's clock in Unix milliseconds; 'now' is stable within one
// statement.
const now = `CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER)`

type queries struct {
	stmts                  [store.NumStmts]string
	get, list, deleteBatch string
}

const columns = `scope, event_id, state, attempts, first_seen, updated_at, lease_until, completed_at, status,
	fingerprint, response_headers IS NOT NULL, COALESCE(length(response_body), 0), response_size, response_sha256,
	COALESCE(hold_reason, ''), ambiguous`

func buildQueries(t string) queries {
	return queries{
		// The statements store.Driver runs (typed in the store package), by store.Stmt.
		stmts: [store.NumStmts]string{
			// One statement decides the claim, as in the postgres store. ?4 is
			// the lease in milliseconds.
			store.StmtClaim: `INSERT INTO ` + t + ` AS e
					(scope, event_id, state, token, attempts, lease_until, first_seen, updated_at, fingerprint)
				VALUES (?1, ?2, 'processing', ?3, 1, ` + now + ` + ?4, ` + now + `, ` + now + `, ?6)
				ON CONFLICT (scope, event_id) DO UPDATE SET
					state        = 'processing',
					token        = excluded.token,
					attempts     = e.attempts + 1,
					lease_until  = excluded.lease_until,
					updated_at   = excluded.updated_at,
					completed_at = NULL,
					status       = 0,
					fingerprint  = excluded.fingerprint,
					response_headers = NULL, response_body = NULL, response_size = 0, response_sha256 = '',
					ambiguous    = e.ambiguous + CASE WHEN e.state = 'processing' THEN 1 ELSE 0 END
				WHERE ` + store.ClaimableSQL(now, "?5") + `
				RETURNING attempts, ambiguous`,
			// The lease left in microseconds, as the store wants it.
			store.StmtInspect: `SELECT state, token, attempts, status, COALESCE(MAX(lease_until - ` + now + `, 0), 0) * 1000,
					fingerprint
				FROM ` + t + ` WHERE scope = ?1 AND event_id = ?2`,
			store.StmtHoldExpired: `UPDATE ` + t + ` SET state = 'held', token = '', lease_until = NULL, updated_at = ` + now + `,
					hold_reason = ?4, ambiguous = ambiguous + 1
				WHERE scope = ?1 AND event_id = ?2 AND state = 'processing' AND token = ?3 AND lease_until <= ` + now + `
				RETURNING attempts`,
			store.StmtRenew: `UPDATE ` + t + ` SET lease_until = ` + now + ` + ?4, updated_at = ` + now + `
				WHERE scope = ?1 AND event_id = ?2 AND token = ?3 AND state = 'processing'`,
			store.StmtComplete: `UPDATE ` + t + ` SET state = 'completed', status = ?4, token = '', lease_until = NULL,
					completed_at = ` + now + `, updated_at = ` + now + `
				WHERE scope = ?1 AND event_id = ?2 AND token = ?3 AND state = 'processing'`,
			store.StmtRelease: `UPDATE ` + t + ` SET state = 'released', token = '', lease_until = NULL, updated_at = ` + now + `
				WHERE scope = ?1 AND event_id = ?2 AND token = ?3 AND state = 'processing'`,
			store.StmtHold: `UPDATE ` + t + ` SET state = 'held', token = '', lease_until = NULL, updated_at = ` + now + `,
					hold_reason = ?4, ambiguous = ambiguous + 1
				WHERE scope = ?1 AND event_id = ?2 AND token = ?3 AND state = 'processing'`,
			store.StmtReleaseAmbiguous: `UPDATE ` + t + ` SET state = 'released', token = '', lease_until = NULL, updated_at = ` + now + `,
					ambiguous = ambiguous + 1
				WHERE scope = ?1 AND event_id = ?2 AND token = ?3 AND state = 'processing'`,
			store.StmtForget: `DELETE FROM ` + t + ` WHERE scope = ?1 AND event_id = ?2`,
			// ?3 is 'released' or 'completed'.
			store.StmtResolve: `UPDATE ` + t + ` SET state = ?3, token = '', lease_until = NULL, status = 0, hold_reason = NULL,
					completed_at = CASE WHEN ?3 = 'completed' THEN ` + now + ` END, updated_at = ` + now + `
				WHERE scope = ?1 AND event_id = ?2 AND ` + store.ResolvableSQL(now),
			store.StmtCompleteResponse: `UPDATE ` + t + ` SET state = 'completed', status = ?4, token = '', lease_until = NULL,
					completed_at = ` + now + `, updated_at = ` + now + `,
					response_headers = ?5, response_body = ?6, response_size = ?7, response_sha256 = ?8
				WHERE scope = ?1 AND event_id = ?2 AND token = ?3 AND state = 'processing'`,
			store.StmtResponse: `SELECT status, response_headers, COALESCE(response_body, X''), response_size,
					response_sha256, fingerprint
				FROM ` + t + ` WHERE scope = ?1 AND event_id = ?2 AND state = 'completed' AND response_headers IS NOT NULL`,
		},
		get:  `SELECT ` + columns + ` FROM ` + t + ` WHERE scope = ?1 AND event_id = ?2`,
		list: `SELECT ` + columns + ` FROM ` + t,
		// ?3 is a JSON array of the scopes.
		deleteBatch: `DELETE FROM ` + t + ` WHERE (scope, event_id) IN (
				SELECT scope, event_id FROM ` + t + `
				WHERE scope IN (SELECT value FROM json_each(?3)) AND first_seen < ?1 AND state <> 'processing'
				LIMIT ?2)`,
	}
}

// driver is the store.Driver of SQLite: the statements of queries on db,
// errors mapped by interpretError. Times are Unix milliseconds.
type driver struct {
	db *sql.DB
	q  *queries
	// prepared are the statements of a batch, prepared once on the single
	// connection (modernc.org/sqlite keeps none: each would be parsed again
	// per call); nil entries are prepared per call.
	prepared *[store.NumStmts]*sql.Stmt
}

var _ store.Driver = driver{}

func (d driver) GetRow(ctx context.Context, scope, eventID string) (store.Event, bool, error) {
	ev, err := scanEvent(d.db.QueryRowContext(ctx, d.q.get, scope, eventID))
	return ev, err == nil, noRows(err)
}

func (d driver) ListRows(ctx context.Context, q store.ListQuery) ([]store.Event, error) {
	var (
		where []string
		args  []any
	)
	if q.State != "" {
		where = append(where, "state = ?")
		args = append(args, string(q.State))
	}
	if q.Scope != "" {
		where = append(where, "scope = ?")
		args = append(args, q.Scope)
	}
	if !q.OlderThan.IsZero() {
		where = append(where, "updated_at < ?")
		args = append(args, q.OlderThan.UnixMilli())
	}
	if !q.AfterUpdatedAt.IsZero() {
		where = append(where, "(updated_at, scope, event_id) > (?, ?, ?)")
		args = append(args, q.AfterUpdatedAt.UnixMilli(), q.AfterScope, q.AfterID)
	}
	query := d.q.list
	if len(where) > 0 {
		query += " WHERE " + strings.Join(where, " AND ")
	}
	query += " ORDER BY updated_at, scope, event_id LIMIT ?"
	args = append(args, q.Limit)

	rows, err := d.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, interpretError(err)
	}
	defer rows.Close()
	var events []store.Event
	for rows.Next() {
		ev, err := scanEvent(rows)
		if err != nil {
			return nil, interpretError(err)
		}
		events = append(events, ev)
	}
	return events, interpretError(rows.Err())
}

func (d driver) DeleteRows(ctx context.Context, scopes []string, cutoff time.Time, limit int) (int, error) {
	scopesJSON, err := json.Marshal(scopes)
	if err != nil {
		return 0, err
	}
	res, err := d.db.ExecContext(ctx, d.q.deleteBatch, cutoff.UnixMilli(), limit, string(scopesJSON))
	if err != nil {
		return 0, interpretError(err)
	}
	n, err := res.RowsAffected()
	return int(n), interpretError(err)
}

func (d driver) Close() error {
	if d.prepared != nil {
		for _, st := range d.prepared {
			if st != nil {
				_ = st.Close()
			}
		}
	}
	return interpretError(d.db.Close())
}

// QueryStmt runs a statement that returns one row; see args.
func (d driver) QueryStmt(ctx context.Context, stmt store.Stmt, args ...any) store.Row {
	return row{d.db.QueryRowContext(ctx, d.q.stmts[stmt], convert(args)...)}
}

// ExecStmt runs a statement that changes one row; see args.
func (d driver) ExecStmt(ctx context.Context, stmt store.Stmt, args ...any) (bool, error) {
	res, err := d.db.ExecContext(ctx, d.q.stmts[stmt], convert(args)...)
	if err != nil {
		return false, interpretError(err)
	}
	n, err := res.RowsAffected()
	return n > 0, interpretError(err)
}

// convert turns a statement's args into SQLite's: a lease in
// milliseconds, a state as text.
func convert(args []any) []any {
	for i, a := range args {
		switch v := a.(type) {
		case time.Duration:
			args[i] = leaseMillis(v)
		case store.State:
			args[i] = string(v)
		}
	}
	return args
}

// row maps the errors of a scanned row (no row: store.ErrNotFound).
type row struct{ r *sql.Row }

func (r row) Scan(dest ...any) error { return interpretError(r.r.Scan(dest...)) }

// noRows maps a single-row statement's error: no row is not an error (the
// caller reports ok false), anything else is mapped.
func noRows(err error) error {
	if errors.Is(err, sql.ErrNoRows) {
		return nil
	}
	return interpretError(err)
}

type scanner interface{ Scan(dest ...any) error }

func scanEvent(row scanner) (store.Event, error) {
	var (
		ev                    store.Event
		state                 string
		firstSeen, updatedAt  int64
		leaseUntil, completed sql.NullInt64
		// the stored response's columns (store.NewResponseInfo)
		hasResponse  bool
		stored, size int64
		sum          string
	)
	err := row.Scan(&ev.Scope, &ev.EventID, &state, &ev.Attempts, &firstSeen, &updatedAt,
		&leaseUntil, &completed, &ev.Status,
		&ev.Fingerprint, &hasResponse, &stored, &size, &sum, &ev.HoldReason, &ev.Ambiguous)
	if err != nil {
		return store.Event{}, err
	}
	ev.State = store.State(state)
	ev.FirstSeen = fromMillis(firstSeen)
	ev.UpdatedAt = fromMillis(updatedAt)
	if leaseUntil.Valid {
		ev.LeaseUntil = fromMillis(leaseUntil.Int64)
	}
	if completed.Valid {
		ev.CompletedAt = fromMillis(completed.Int64)
	}
	ev.Response = store.NewResponseInfo(hasResponse, stored, size, sum)
	return ev, nil
}

func fromMillis(ms int64) time.Time { return time.UnixMilli(ms).UTC() }

// leaseMillis is a lease in milliseconds, rounded up.
func leaseMillis(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}
