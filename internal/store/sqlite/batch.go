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
// SQLite has one writer, so nothing changes a row between a claim's
// statement and the read that explains its refusal: every claim is decided
// here. An unchanged row (a completed event's duplicate) is not written.
func (d driver) WriteBatch(ctx context.Context, b *store.Batch) (err error) {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return interpretError(err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	for n := range b.Claims {
		if err := d.claimTx(ctx, tx, &b.Claims[n]); err != nil {
			return interpretError(err)
		}
	}
	for n := range b.Settles {
		s := &b.Settles[n]
		args := []any{s.Scope, s.EventID, s.Token}
		if s.Stmt == store.StmtComplete {
			args = append(args, s.Status)
		}
		res, err := tx.ExecContext(ctx, d.q.stmts[s.Stmt], args...)
		if err != nil {
			return interpretError(err)
		}
		changed, err := res.RowsAffected()
		if err != nil {
			return interpretError(err)
		}
		s.Changed = changed > 0
	}
	return interpretError(tx.Commit())
}

// claimTx runs one claim's statement and, when it is refused, reads the
// row that refused it.
func (d driver) claimTx(ctx context.Context, tx *sql.Tx, c *store.BatchClaim) error {
	err := tx.QueryRowContext(ctx, d.q.stmts[store.StmtClaim],
		c.Scope, c.EventID, c.Token, leaseMillis(c.Lease), c.Hold).Scan(&c.Attempts)
	if err == nil {
		c.Claimed = true
		return nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	var (
		state  string
		token  string
		micros int64
	)
	err = tx.QueryRowContext(ctx, d.q.stmts[store.StmtInspect], c.Scope, c.EventID).
		Scan(&state, &token, &c.Attempts, &c.Status, &micros)
	if errors.Is(err, sql.ErrNoRows) {
		return nil // cannot happen with one writer; the store claims it on its own
	}
	c.State, c.LeaseLeft = store.State(state), time.Duration(micros)*time.Microsecond
	return err
}
