package postgres

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/pgschema"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

type queries struct {
	stmts                  [store.NumStmts]string
	get, list, deleteBatch string
	batch                  batchQueries
	// commit: complete_by upstream (commit.go).
	commit commitQueries
}

const columns = `scope, event_id, state, attempts, first_seen, updated_at, lease_until, completed_at, status,
	fingerprint, response_headers IS NOT NULL, COALESCE(length(response_body), 0), response_size, response_sha256,
	COALESCE(hold_reason, ''), ambiguous`

// buildQueries builds the driver's statements from the validated, quoted
// table name. The claimable and resolvable predicates are the store's.
func buildQueries(ident pgx.Identifier) queries {
	t := ident.Sanitize()
	return queries{
		// The statements store.Driver runs (typed in the store package), by store.Stmt.
		stmts: [store.NumStmts]string{
			// One statement decides the claim: the primary key settles races,
			// and a conflicting row is taken over only when it is claimable.
			// $4 is the lease in microseconds.
			// A row another transaction holds (an upstream between its
			// <table>_commit and its commit) is not claimed, lest the
			// statement wait for that transaction: lk locks a claimable row
			// or skips it, and the INSERT runs only for an absent row or a
			// locked one. StmtInspect then reports the skipped row in flight.
			store.StmtClaim: `WITH lk AS (
					SELECT 1 FROM ` + t + ` e WHERE e.scope = $1 AND e.event_id = $2
						AND (` + store.ClaimableSQL("now()", "$5::boolean") + `)
					FOR UPDATE SKIP LOCKED
				)
				INSERT INTO ` + t + ` AS e
					(scope, event_id, state, token, attempts, lease_until, first_seen, updated_at, fingerprint)
				SELECT $1::text, $2::text, 'processing', $3::text, 1, now() + $4::bigint * interval '1 microsecond',
					now(), now(), $6::text
				WHERE EXISTS (SELECT 1 FROM lk)
					OR NOT EXISTS (SELECT 1 FROM ` + t + ` x WHERE x.scope = $1 AND x.event_id = $2)
				` + takeoverSQL("$5::boolean") + `
				RETURNING e.attempts, e.ambiguous`,
			// Why the claim was refused; the lease left in microseconds, by the
			// database clock. A claimable row another transaction holds reads
			// as processing with one second left (in flight: see StmtClaim).
			store.StmtInspect: `SELECT CASE WHEN l.locked THEN 'processing' ELSE e.state END, e.token, e.attempts, e.status,
					CASE WHEN l.locked THEN 1000000 ELSE ` + LeaseLeftSQL("e.") + ` END::bigint,
					e.fingerprint
				FROM ` + t + ` e CROSS JOIN LATERAL (SELECT (` + store.ClaimableSQL("now()", "false") + `)
					AND NOT EXISTS (SELECT 1 FROM ` + t + ` x WHERE x.scope = $1 AND x.event_id = $2
						FOR SHARE SKIP LOCKED) AS locked) l
				WHERE e.scope = $1 AND e.event_id = $2`,
			// The statements below find their row by primary key (scope,
			// event ID); "state || ''" keeps the planner off the (state,
			// updated_at) index, whose 'processing' entries, dead ones
			// included until a vacuum, are as many as the deliveries (see
			// batchQueries.complete).
			store.StmtHoldExpired: `UPDATE ` + t + ` SET state = 'held', token = '', lease_until = NULL, updated_at = now(),
					hold_reason = $4, ambiguous = ambiguous + 1
				WHERE scope = $1 AND event_id = $2 AND state || '' = 'processing' AND token = $3 AND lease_until <= now()
				RETURNING attempts`,
			store.StmtRenew: `UPDATE ` + t + ` SET lease_until = now() + $4::bigint * interval '1 microsecond', updated_at = now()
				WHERE scope = $1 AND event_id = $2 AND token = $3 AND state || '' = 'processing'`,
			store.StmtComplete: `UPDATE ` + t + ` SET state = 'completed', status = $4, token = '', lease_until = NULL,
					completed_at = now(), updated_at = now()
				WHERE scope = $1 AND event_id = $2 AND token = $3 AND state || '' = 'processing'`,
			store.StmtRelease: `UPDATE ` + t + ` SET state = 'released', token = '', lease_until = NULL, updated_at = now()
				WHERE scope = $1 AND event_id = $2 AND token = $3 AND state || '' = 'processing'`,
			store.StmtHold: `UPDATE ` + t + ` SET state = 'held', token = '', lease_until = NULL, updated_at = now(),
					hold_reason = $4, ambiguous = ambiguous + 1
				WHERE scope = $1 AND event_id = $2 AND token = $3 AND state || '' = 'processing'`,
			store.StmtReleaseAmbiguous: `UPDATE ` + t + ` SET state = 'released', token = '', lease_until = NULL, updated_at = now(),
					ambiguous = ambiguous + 1
				WHERE scope = $1 AND event_id = $2 AND token = $3 AND state || '' = 'processing'`,
			store.StmtForget: `DELETE FROM ` + t + ` WHERE scope = $1 AND event_id = $2`,
			// An operator's decision on a held row or an expired claim; $3 is
			// 'released' or 'completed'.
			store.StmtResolve: `UPDATE ` + t + ` SET state = $3::text, token = '', lease_until = NULL, status = 0, hold_reason = NULL,
					completed_at = CASE WHEN $3::text = 'completed' THEN now() END, updated_at = now()
				WHERE scope = $1 AND event_id = $2 AND ` + store.ResolvableSQL("now()"),
			store.StmtCompleteResponse: `UPDATE ` + t + ` SET state = 'completed', status = $4, token = '', lease_until = NULL,
					completed_at = now(), updated_at = now(),
					response_headers = $5, response_body = $6, response_size = $7, response_sha256 = $8
				WHERE scope = $1 AND event_id = $2 AND token = $3 AND state || '' = 'processing'`,
			store.StmtResponse: `SELECT status, response_headers, COALESCE(response_body, ''::bytea), response_size,
					response_sha256, fingerprint
				FROM ` + t + ` WHERE scope = $1 AND event_id = $2 AND state || '' = 'completed' AND response_headers IS NOT NULL`,
		},
		batch: buildBatchQueries(ident),
		get:   `SELECT ` + columns + ` FROM ` + t + ` WHERE scope = $1 AND event_id = $2`,
		list:  `SELECT ` + columns + ` FROM ` + t,
		// Bounded: at most $2 rows of the scopes $3, skipping rows other
		// sessions hold (a claim in progress), never a processing row.
		deleteBatch: `DELETE FROM ` + t + ` WHERE (scope, event_id) IN (
				SELECT scope, event_id FROM ` + t + `
				WHERE scope = ANY($3::text[]) AND first_seen < $1 AND state <> 'processing'
				LIMIT $2
				FOR UPDATE SKIP LOCKED)
			AND state <> 'processing'`,

		// complete_by upstream (commit.go).
		commit: buildCommitQueries(ident),
	}
}

// dbtx is what the driver runs statements on: the pool, or the caller's
// transaction (InTx).
type dbtx interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// driver is the store.Driver of PostgreSQL: the statements of queries on
// db, errors mapped by interpretError. Durations travel in microseconds,
// PostgreSQL's resolution.
type driver struct {
	db dbtx
	q  *queries
	// pool is closed by Close; nil on a transaction.
	pool *pgxpool.Pool
	// run runs the statements of the delivery path (claims, settles,
	// heartbeats, stored responses) within the statement deadline, slow
	// the others (reads for operators, sweeps) within their caller's;
	// both run a transaction rolled back by a conflict again. Zero on a
	// transaction: its caller retries it whole.
	run, slow pgschema.Runner
}

var _ store.Driver = driver{}

func (d driver) GetRow(ctx context.Context, scope, eventID string) (ev store.Event, ok bool, err error) {
	err = d.slow.Run(ctx, func(ctx context.Context) error {
		rows, err := d.db.Query(ctx, d.q.get, scope, eventID)
		if err != nil {
			return interpretError(err)
		}
		ev, err = pgx.CollectExactlyOneRow(rows, scanEvent)
		ok = err == nil
		return noRows(err)
	})
	return ev, ok, err
}

func (d driver) ListRows(ctx context.Context, q store.ListQuery) ([]store.Event, error) {
	var (
		where []string
		args  []any
	)
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	if q.State != "" {
		where = append(where, "state = "+arg(string(q.State)))
	}
	if q.Scope != "" {
		where = append(where, "scope = "+arg(q.Scope))
	}
	if !q.OlderThan.IsZero() {
		where = append(where, "updated_at < "+arg(q.OlderThan))
	}
	if !q.AfterUpdatedAt.IsZero() {
		where = append(where, "(updated_at, scope, event_id) > ("+
			arg(q.AfterUpdatedAt)+", "+arg(q.AfterScope)+", "+arg(q.AfterID)+")")
	}
	query := d.q.list
	if len(where) > 0 {
		query += " WHERE " + strings.Join(where, " AND ")
	}
	query += " ORDER BY updated_at, scope, event_id LIMIT " + arg(q.Limit)

	var events []store.Event
	err := d.slow.Run(ctx, func(ctx context.Context) error {
		rows, err := d.db.Query(ctx, query, args...)
		if err != nil {
			return interpretError(err)
		}
		events, err = pgx.CollectRows(rows, scanEvent)
		return interpretError(err)
	})
	return events, err
}

func (d driver) DeleteRows(ctx context.Context, scopes []string, cutoff time.Time, limit int) (n int, err error) {
	err = d.slow.Run(ctx, func(ctx context.Context) error {
		tag, err := d.db.Exec(ctx, d.q.deleteBatch, cutoff, limit, scopes)
		n = int(tag.RowsAffected())
		return interpretError(err)
	})
	return n, err
}

func (d driver) Close() error {
	if d.pool != nil {
		d.pool.Close()
	}
	return nil
}

// QueryStmt runs a statement that returns one row, when the row is
// scanned; see args.
func (d driver) QueryStmt(ctx context.Context, stmt store.Stmt, args ...any) store.Row {
	return row{d: d, ctx: ctx, sql: d.q.stmts[stmt], args: convert(args)}
}

// ExecStmt runs a statement that changes one row; see args.
func (d driver) ExecStmt(ctx context.Context, stmt store.Stmt, args ...any) (changed bool, err error) {
	args = convert(args)
	err = d.run.Run(ctx, func(ctx context.Context) error {
		tag, err := d.db.Exec(ctx, d.q.stmts[stmt], args...)
		changed = tag.RowsAffected() > 0
		return interpretError(err)
	})
	return changed, err
}

// convert turns a statement's args into PostgreSQL's: a lease in
// microseconds, a state as text.
func convert(args []any) []any {
	for i, a := range args {
		switch v := a.(type) {
		case time.Duration:
			args[i] = leaseMicros(v)
		case store.State:
			args[i] = string(v)
		}
	}
	return args
}

// row is a statement run when scanned (queryRow), by the driver's
// run; its errors mapped (no row: store.ErrNotFound).
type row struct {
	d    driver
	ctx  context.Context //nolint:containedctx // the statement's, used once by Scan
	sql  string
	args []any
}

func (r row) Scan(dest ...any) error {
	return r.d.run.Run(r.ctx, func(ctx context.Context) error {
		return interpretError(r.d.db.QueryRow(ctx, r.sql, r.args...).Scan(dest...))
	})
}

// noRows maps a single-row statement's error: no row is not an error
// (the caller reports ok false), anything else is mapped.
func noRows(err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	return interpretError(err)
}

func scanEvent(row pgx.CollectableRow) (store.Event, error) {
	var (
		ev                    store.Event
		state                 string
		leaseUntil, completed *time.Time
		// the stored response's columns (store.NewResponseInfo)
		hasResponse  bool
		stored, size int64
		sum          string
	)
	err := row.Scan(&ev.Scope, &ev.EventID, &state, &ev.Attempts, &ev.FirstSeen, &ev.UpdatedAt,
		&leaseUntil, &completed, &ev.Status,
		&ev.Fingerprint, &hasResponse, &stored, &size, &sum, &ev.HoldReason, &ev.Ambiguous)
	if err != nil {
		return store.Event{}, err
	}
	ev.State = store.State(state)
	ev.FirstSeen = ev.FirstSeen.UTC()
	ev.UpdatedAt = ev.UpdatedAt.UTC()
	if leaseUntil != nil {
		ev.LeaseUntil = leaseUntil.UTC()
	}
	if completed != nil {
		ev.CompletedAt = completed.UTC()
	}
	ev.Response = store.NewResponseInfo(hasResponse, stored, size, sum)
	return ev, nil
}

// leaseMicros is a lease in whole microseconds (PostgreSQL's resolution),
// at least one.
func leaseMicros(d time.Duration) int64 {
	return max(d.Microseconds(), 1)
}

// takeoverSQL is a claim's ON CONFLICT clause, shared by the one-row and
// the batch claim statements: a conflicting row is taken over only when it
// is claimable (store.ClaimableSQL; hold is the statement's HoldOnExpiry
// parameter), with the inserted row's token, lease and fingerprint (empty
// when the statement inserts none), its attempts counted, and its status
// and stored response cleared. The row is aliased e.
func takeoverSQL(hold string) string {
	return `ON CONFLICT (scope, event_id) DO UPDATE SET
					state        = 'processing',
					token        = EXCLUDED.token,
					attempts     = e.attempts + 1,
					lease_until  = EXCLUDED.lease_until,
					updated_at   = EXCLUDED.updated_at,
					completed_at = NULL,
					status       = 0,
					fingerprint  = EXCLUDED.fingerprint,
					response_headers = NULL, response_body = NULL, response_size = 0, response_sha256 = '',
					ambiguous    = e.ambiguous + CASE WHEN e.state = 'processing' THEN 1 ELSE 0 END
				WHERE ` + store.ClaimableSQL("now()", hold)
}

// LeaseLeftSQL is the lease left on a row by the database clock, in whole
// microseconds (0 when expired or when the row holds none), as a bigint
// expression; alias is the row's alias with its dot ("e.") or "". The
// store's and the queue's statements read it the same way.
func LeaseLeftSQL(alias string) string {
	return `COALESCE(GREATEST(0, CEIL(EXTRACT(EPOCH FROM (` + alias + `lease_until - now())) * 1000000)), 0)::bigint`
}
