package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/queue"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// commitInTx is the upstream's transaction: <table>_commit with the
// delivery's queue claim, left open for the caller to end.
func (f *fixture) commitInTx(j queue.Job) pgx.Tx {
	f.t.Helper()
	tx, err := f.store.Pool().Begin(ctxT(f.t))
	require.NoError(f.t, err)
	f.t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = tx.Exec(ctxT(f.t), `SELECT `+pgx.Identifier{f.table + "_commit"}.Sanitize()+`($1)`,
		store.QueueClaimValue(j.Scope, j.EventID, j.Token))
	require.NoError(f.t, err)
	return tx
}

// TestConcludeByTheUpstream: a delivery the upstream's transaction
// committed is delivered whatever the attempt saw; while that transaction
// is open, the heartbeat does not wait, the lease's expiry does not take
// the event back, and Conclude waits (ErrPending when its wait runs out);
// a rolled-back one is settled as the attempt saw it.
func TestConcludeByTheUpstream(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.enqueue(entry("s", "evt_1"))
	j := f.take(queue.TakeParams{Scope: "s", Limit: 1, Lease: 200 * time.Millisecond, Worker: "w"}).Jobs[0]
	tx := f.commitInTx(j)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, f.q.Heartbeat(ctx, j.ID, j.Token, 200*time.Millisecond), "not lost, and no wait")
	_, _, err := f.q.Conclude(ctx, queue.Settlement{ID: j.ID, Token: j.Token, Attempt: j.Attempt}, 50*time.Millisecond)
	require.ErrorIs(t, err, queue.ErrPending)
	time.Sleep(300 * time.Millisecond) //nolint:forbidigo // the lease must expire by the database clock
	require.Empty(t, f.take(queue.TakeParams{Scope: "s", Limit: 1, Worker: "other"}).Jobs,
		"an expired lease the upstream's transaction holds is not taken back")

	require.NoError(t, tx.Commit(ctx))
	state, committed, err := f.q.Conclude(ctx, queue.Settlement{ID: j.ID, Token: j.Token, Attempt: j.Attempt,
		Status: 0, Error: "connection reset"}, time.Second)
	require.NoError(t, err)
	require.True(t, committed)
	require.Equal(t, queue.StateDelivered, state)
	as, err := f.q.Attempts(ctx, j.ID)
	require.NoError(t, err)
	require.Equal(t, queue.AttemptDelivered, as[0].Outcome)
	require.Empty(t, f.take(queue.TakeParams{Scope: "s", Limit: 1, Worker: "other"}).Jobs)

	// Rolled back: settled by what the attempt saw (500: queued again).
	f.enqueue(entry("s", "evt_2"))
	j2 := f.take(queue.TakeParams{Scope: "s", Limit: 1, Worker: "w"}).Jobs[0]
	tx = f.commitInTx(j2)
	require.NoError(t, tx.Rollback(ctx))
	state, committed, err = f.q.Conclude(ctx, queue.Settlement{ID: j2.ID, Token: j2.Token, Attempt: j2.Attempt,
		Status: 500, MaxAttempts: 5}, time.Second)
	require.NoError(t, err)
	require.False(t, committed)
	require.Equal(t, queue.StateQueued, state)
	_, err = f.store.Pool().Exec(ctx, `SELECT `+pgx.Identifier{f.table + "_commit"}.Sanitize()+`($1)`,
		store.QueueClaimValue(j2.Scope, j2.EventID, j2.Token))
	require.Error(t, err, "the attempt's claim is gone: a late commit is refused")
}
