package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

var _ store.BatchDriver = driver{}

// WriteBatch runs b in one IMMEDIATE transaction on the single connection:
// the statements of one claim or settle each, as one at a time would, but
// one commit (one fsync of the WAL with synchronous FULL) for the batch.
// SQLite has one writer, so within the transaction nothing changes a row
// between a claim's statement and the read that explains its refusal. An
// unchanged row (a completed event's duplicate) is not written. A batch of
// one operation runs without the transaction around it (its statement
// commits by itself), as cheap as before batching.
func (d driver) WriteBatch(ctx context.Context, b *store.Batch) (err error) {
	if len(b.Claims)+len(b.Settles) == 1 {
		// A lone operation needs no transaction around it: its statement
		// commits by itself. (A lone claim's refusal is read after the
		// claim's own commit; if the row changed in between, the store
		// finds a state it cannot answer from and claims again itself.)
		return interpretError(d.writeOps(ctx, dbQuerier{d.db}, b))
	}
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return interpretError(err)
	}
	if err := d.writeOps(ctx, tx, b); err != nil {
		_ = tx.Rollback()
		return interpretError(err)
	}
	return interpretError(tx.Commit())
}

// querier is a *sql.DB or a *sql.Tx.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	StmtContext(ctx context.Context, stmt *sql.Stmt) *sql.Stmt
}

// dbQuerier is the *sql.DB as a querier: a prepared statement is itself.
type dbQuerier struct{ *sql.DB }

func (dbQuerier) StmtContext(_ context.Context, stmt *sql.Stmt) *sql.Stmt { return stmt }

// batchStmts are the statements WriteBatch runs, prepared once.
var batchStmts = []store.Stmt{store.StmtClaim, store.StmtInspect, store.StmtComplete, store.StmtRelease, store.StmtHold}

// prepare prepares batchStmts on the database (its single connection).
func (d driver) prepare(ctx context.Context) (*[store.NumStmts]*sql.Stmt, error) {
	var p [store.NumStmts]*sql.Stmt
	for _, stmt := range batchStmts {
		st, err := d.db.PrepareContext(ctx, d.q.stmts[stmt]) //nolint:sqlclosecheck // kept for the store's life, closed by driver.Close
		if err != nil {
			for _, st := range p {
				if st != nil {
					_ = st.Close()
				}
			}
			return nil, err
		}
		p[stmt] = st
	}
	return &p, nil
}

// exec runs stmt on q, prepared when it can be.
func (d driver) exec(ctx context.Context, q querier, stmt store.Stmt, args ...any) (sql.Result, error) {
	if d.prepared != nil && d.prepared[stmt] != nil {
		return q.StmtContext(ctx, d.prepared[stmt]).ExecContext(ctx, args...) //nolint:sqlclosecheck // a transaction's statement closes with it
	}
	return q.ExecContext(ctx, d.q.stmts[stmt], args...)
}

// queryRow is exec for a statement that returns a row.
func (d driver) queryRow(ctx context.Context, q querier, stmt store.Stmt, args ...any) *sql.Row {
	if d.prepared != nil && d.prepared[stmt] != nil {
		return q.StmtContext(ctx, d.prepared[stmt]).QueryRowContext(ctx, args...) //nolint:sqlclosecheck // a transaction's statement closes with it
	}
	return q.QueryRowContext(ctx, d.q.stmts[stmt], args...)
}

// writeOps runs b's statements on q.
func (d driver) writeOps(ctx context.Context, q querier, b *store.Batch) error {
	for n := range b.Claims {
		if err := d.claimTx(ctx, q, &b.Claims[n]); err != nil {
			return err
		}
	}
	for n := range b.Settles {
		s := &b.Settles[n]
		res, err := d.exec(ctx, q, s.Stmt, store.SettleArgs(s)...)
		if err != nil {
			return err
		}
		changed, err := res.RowsAffected()
		if err != nil {
			return err
		}
		s.Changed = changed > 0
	}
	return nil
}

// claimTx runs one claim's statement and, when it is refused, reads the
// row that refused it.
func (d driver) claimTx(ctx context.Context, tx querier, c *store.BatchClaim) error {
	err := d.queryRow(ctx, tx, store.StmtClaim, c.Scope, c.EventID, c.Token, leaseMillis(c.Lease), c.Hold, "").Scan(&c.Attempts, &c.Ambiguous) // no fingerprint: such claims are not batched (store.Rules.Claim)
	if err == nil {
		c.Claimed = true
		return nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	var (
		state, token, fingerprint string
		micros                    int64
	)
	err = d.queryRow(ctx, tx, store.StmtInspect, c.Scope, c.EventID).
		Scan(&state, &token, &c.Attempts, &c.Status, &micros, &fingerprint)
	if errors.Is(err, sql.ErrNoRows) {
		return nil // deleted since (a lone claim): the store claims it on its own
	}
	c.State, c.LeaseLeft = store.State(state), time.Duration(micros)*time.Microsecond
	return err
}
