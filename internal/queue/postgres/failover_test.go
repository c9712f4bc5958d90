package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/e2e"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/queue"
	pgqueue "github.com/webhook-idempotency/caddy-webhook-idempotency/internal/queue/postgres"
	pgstore "github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store/postgres"
)

// The queue on a multi-host DSN, across a failover: the primary is killed
// (immediate shutdown) while events are queued and taken, enqueueing fails
// as a store error while there is no primary, and once the synchronous
// standby is promoted the same queue (same pool, no restart) enqueues on
// it; the entry queued and the event taken before the failover are there,
// and the taken event's settle lands on the new primary.
func TestQueueFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("starts temporary PostgreSQL servers; skipped with -short")
	}
	if _, err := e2e.PGBinDir(); err != nil {
		t.Skip(err.Error())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := e2e.StartTempCluster(ctx, e2e.Sync)
	require.NoError(t, err)
	t.Cleanup(c.Close)

	s, err := pgstore.New(ctx, pgstore.Options{DSN: c.DSN("postgres")})
	require.NoError(t, err)
	defer s.Close()
	q, err := pgqueue.New(ctx, s, pgqueue.Options{})
	require.NoError(t, err)
	defer q.Close()

	enqueue := func(id string) (queue.Enqueued, error) {
		ectx, ecancel := context.WithTimeout(ctx, 5*time.Second)
		defer ecancel()
		return q.Enqueue(ectx, entry("s", id))
	}
	out, err := enqueue("evt_queued")
	require.NoError(t, err)
	require.Equal(t, queue.Queued, out.Outcome)
	_, err = enqueue("evt_taken")
	require.NoError(t, err)
	b, err := q.Take(ctx, queue.TakeParams{Scope: "s", Limit: 1, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, b.Jobs, 1)
	taken := b.Jobs[0]

	require.NoError(t, c.Primary.Stop(ctx, "immediate"))
	_, err = enqueue("evt_down")
	require.Error(t, err, "no primary: enqueueing fails (the handler answers 503)")

	require.NoError(t, c.Standby.Promote(ctx))
	t0 := time.Now()
	for {
		out, err = enqueue("evt_after")
		if err == nil {
			break
		}
		require.Less(t, time.Since(t0), 10*time.Second, "enqueueing still fails after the promotion: %v", err)
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("enqueueing works %s after the promotion", time.Since(t0).Round(time.Millisecond))
	require.Equal(t, queue.Queued, out.Outcome)

	out, err = enqueue("evt_queued")
	require.NoError(t, err)
	require.Equal(t, queue.Duplicate, out.Outcome, "the entry queued on the old primary is on the new one")
	st, err := q.Settle(ctx, queue.Settlement{ID: taken.ID, Token: taken.Token, Attempt: taken.Attempt,
		Status: 200, Delivered: true, Duration: time.Millisecond})
	require.NoError(t, err, "the take made on the old primary settles on the new one")
	require.Equal(t, queue.StateDelivered, st)
}
