package postgres_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/queue"
	pgqueue "github.com/webhook-idempotency/caddy-webhook-idempotency/internal/queue/postgres"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/queue/queuetest"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
	pgstore "github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store/postgres"
)

// These tests run on the real PostgreSQL (TEST_DATABASE_URL), each on fresh
// tables that are dropped at the end; they skip under -short when the
// server is unreachable.

type fixture struct {
	t     *testing.T
	store *pgstore.Store
	q     *pgqueue.Queue
	table string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	tt := queuetest.New(t, "qt_", pgstore.Options{MaxConns: 20}, pgqueue.Options{})
	return &fixture{t: t, store: tt.Store, q: tt.Queue, table: tt.Name}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func entry(scope, id string) queue.Entry {
	return queue.Entry{
		Scope: scope, EventID: id,
		Request: queue.Request{
			Method: http.MethodPost, URI: "/hooks?x=1",
			Header: http.Header{"Content-Type": {"application/json"}, "Stripe-Signature": {"t=1,v1=ab"}},
			Body:   []byte(`{"id":"` + id + `"}`),
		},
		Claims:      []queue.Key{{Scope: scope, EventID: id}},
		ClaimStatus: 202,
	}
}

func (f *fixture) enqueue(e queue.Entry) queue.Enqueued {
	f.t.Helper()
	out, err := f.q.Enqueue(ctxT(f.t), e)
	require.NoError(f.t, err)
	return out
}

func (f *fixture) take(p queue.TakeParams) queue.Batch {
	f.t.Helper()
	if p.Lease == 0 {
		p.Lease = time.Minute
	}
	b, err := f.q.Take(ctxT(f.t), p)
	require.NoError(f.t, err)
	return b
}

func (f *fixture) settle(j queue.Job, delivered bool, retryIn time.Duration, maxAttempts int) queue.State {
	f.t.Helper()
	status := 200
	if !delivered {
		status = 500
	}
	st, err := f.q.Settle(ctxT(f.t), queue.Settlement{ID: j.ID, Token: j.Token, Attempt: j.Attempt,
		Status: status, Delivered: delivered, RetryIn: retryIn, MaxAttempts: maxAttempts, Duration: time.Millisecond})
	require.NoError(f.t, err)
	return st
}

func (f *fixture) state(scope, id string) queue.State {
	f.t.Helper()
	ev, err := f.q.Get(ctxT(f.t), scope, id)
	require.NoError(f.t, err)
	return ev.State
}

func TestEnqueueAtMostOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	out := f.enqueue(entry("s", "evt_1"))
	require.Equal(t, queue.Queued, out.Outcome)
	require.Positive(t, out.ID)

	// The claim is in the events table, completed with the queue's status.
	ev, err := f.store.Get(ctxT(t), "s", "evt_1")
	require.NoError(t, err)
	require.Equal(t, store.StateCompleted, ev.State)
	require.Equal(t, 202, ev.Status)

	again := f.enqueue(entry("s", "evt_1"))
	require.Equal(t, queue.Duplicate, again.Outcome)
	require.Equal(t, 0, again.Refused, "the completed claim decided it")

	// An operator forgot the claim: the queue row still makes it a duplicate.
	require.NoError(t, f.store.Forget(ctxT(t), "s", "evt_1"))
	again = f.enqueue(entry("s", "evt_1"))
	require.Equal(t, queue.Duplicate, again.Outcome)
	require.Equal(t, -1, again.Refused)

	// Concurrent deliveries of one event: exactly one is queued.
	var queued atomic.Int32
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := f.q.Enqueue(context.Background(), entry("s", "evt_race"))
			if err == nil && out.Outcome == queue.Queued {
				queued.Add(1)
			}
		}()
	}
	wg.Wait()
	require.Equal(t, int32(1), queued.Load())

	evs, err := f.q.List(ctxT(t), queue.ListQuery{Scope: "s"})
	require.NoError(t, err)
	require.Len(t, evs, 2)
	require.Equal(t, "/hooks?x=1", evs[0].URI)
	require.True(t, evs[0].BodyKept)
	require.Equal(t, len(`{"id":"evt_1"}`), evs[0].BodySize)
}

func TestEnqueueRefusedClaims(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	// A live synchronous claim: in flight, nothing stored.
	c, err := f.store.Claim(ctxT(t), store.ClaimParams{Scope: "s", EventID: "evt_live", Lease: time.Minute})
	require.NoError(t, err)
	require.Equal(t, store.Claimed, c.Outcome)
	out := f.enqueue(entry("s", "evt_live"))
	require.Equal(t, queue.InFlight, out.Outcome)
	require.GreaterOrEqual(t, out.RetryAfter, 50*time.Second)
	_, err = f.q.Get(ctxT(t), "s", "evt_live")
	require.ErrorIs(t, err, queue.ErrNotFound)

	// A released claim is taken over.
	require.NoError(t, f.store.Release(ctxT(t), "s", "evt_live", c.Token))
	require.Equal(t, queue.Queued, f.enqueue(entry("s", "evt_live")).Outcome)

	// A second claim refused (dedupe_body: the body was delivered under
	// another ID) rolls the first back.
	e := entry("s", "evt_body")
	e.Claims = append(e.Claims, queue.Key{Scope: "s#body", EventID: "sha256:x"})
	_, err = f.store.Claim(ctxT(t), store.ClaimParams{Scope: "s#body", EventID: "sha256:x", Lease: time.Minute})
	require.NoError(t, err)
	out = f.enqueue(e)
	require.Equal(t, queue.InFlight, out.Outcome)
	require.Equal(t, 1, out.Refused)
	_, err = f.store.Get(ctxT(t), "s", "evt_body")
	require.ErrorIs(t, err, store.ErrNotFound, "the first claim was rolled back")
}

func TestTakeSettleRetry(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for i := range 3 {
		f.enqueue(entry("s", fmt.Sprintf("evt_%d", i)))
	}
	f.enqueue(entry("other", "evt_x"))

	b := f.take(queue.TakeParams{Scope: "s", Limit: 2, Worker: "w1"})
	require.Len(t, b.Jobs, 2)
	j := b.Jobs[0]
	require.Equal(t, "evt_0", j.EventID)
	require.Equal(t, 1, j.Attempt)
	require.Equal(t, http.MethodPost, j.Request.Method)
	require.Equal(t, "/hooks?x=1", j.Request.URI)
	require.Equal(t, "t=1,v1=ab", j.Request.Header.Get("Stripe-Signature"))
	require.Equal(t, []byte(`{"id":"evt_0"}`), j.Request.Body)

	require.Equal(t, queue.StateDelivered, f.settle(b.Jobs[0], true, 0, 5))
	require.Equal(t, queue.StateQueued, f.settle(b.Jobs[1], false, time.Hour, 5))

	b = f.take(queue.TakeParams{Scope: "s", Limit: 10})
	require.Len(t, b.Jobs, 1, "evt_1 waits an hour")
	require.Equal(t, "evt_2", b.Jobs[0].EventID)
	f.settle(b.Jobs[0], true, 0, 5)

	b = f.take(queue.TakeParams{Scope: "s", Limit: 10})
	require.Empty(t, b.Jobs)
	require.InDelta(t, time.Hour.Seconds(), b.NextIn.Seconds(), 60)

	// An operator makes it due now: the same round goes on.
	require.NoError(t, f.q.Retry(ctxT(t), "s", "evt_1"))
	b = f.take(queue.TakeParams{Scope: "s", Limit: 10})
	require.Len(t, b.Jobs, 1)
	require.Equal(t, 2, b.Jobs[0].Attempt)
	require.Equal(t, 2, b.Jobs[0].RoundAttempts)
	f.settle(b.Jobs[0], true, 0, 5)

	ev, err := f.q.Get(ctxT(t), "s", "evt_1")
	require.NoError(t, err)
	as, err := f.q.Attempts(ctxT(t), ev.ID)
	require.NoError(t, err)
	require.Len(t, as, 2)
	require.Equal(t, queue.AttemptRetry, as[0].Outcome)
	require.Equal(t, 500, as[0].Status)
	require.Equal(t, "w1", as[0].Worker)
	require.Equal(t, queue.AttemptDelivered, as[1].Outcome)
	require.False(t, as[1].FinishedAt.IsZero())

	err = f.q.Retry(ctxT(t), "s", "evt_1")
	require.ErrorIs(t, err, queue.ErrConflict, "a delivered event is not retried")
	require.ErrorIs(t, f.q.Retry(ctxT(t), "s", "nope"), queue.ErrNotFound)
}

// Takers that hold their events until settled never hold more than
// MaxConcurrency at once between them, whatever their Limit.
func TestMaxConcurrencyAcrossTakers(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const events, limit = 120, 4
	for i := range events {
		f.enqueue(entry("s", fmt.Sprintf("evt_%03d", i)))
	}
	var (
		inFlight, peak atomic.Int32
		delivered      atomic.Int32
		wg             sync.WaitGroup
	)
	deadline := time.Now().Add(60 * time.Second)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for delivered.Load() < events && time.Now().Before(deadline) {
				b, err := f.q.Take(context.Background(), queue.TakeParams{Scope: "s", Limit: 3, MaxConcurrency: limit, Lease: time.Minute})
				if err != nil {
					t.Error(err)
					return
				}
				n := inFlight.Add(int32(len(b.Jobs)))
				for {
					p := peak.Load()
					if n <= p || peak.CompareAndSwap(p, n) {
						break
					}
				}
				for _, j := range b.Jobs {
					inFlight.Add(-1) // before the settle commits: never undercounted
					_, err := f.q.Settle(context.Background(), queue.Settlement{ID: j.ID, Token: j.Token, Attempt: j.Attempt, Status: 200, Delivered: true})
					if err != nil {
						t.Error(err)
						return
					}
					delivered.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	require.Equal(t, int32(events), delivered.Load())
	require.LessOrEqual(t, peak.Load(), int32(limit))
	require.Positive(t, peak.Load())
}

func TestOrderKeyHeadOnly(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for _, k := range []struct{ id, key string }{{"a", "k1"}, {"b", "k1"}, {"c", "k1"}, {"d", "k2"}, {"e", ""}} {
		e := entry("s", k.id)
		e.OrderKey = k.key
		f.enqueue(e)
	}
	ids := func(b queue.Batch) []string {
		var out []string
		for _, j := range b.Jobs {
			out = append(out, j.EventID)
		}
		return out
	}
	b := f.take(queue.TakeParams{Scope: "s", Limit: 10})
	require.Equal(t, []string{"a", "d", "e"}, ids(b))
	require.Equal(t, "k1", b.Jobs[0].OrderKey)
	require.Empty(t, f.take(queue.TakeParams{Scope: "s", Limit: 10}).Jobs, "b waits for a in delivery")

	// a fails and is due again: it stays the head, b still waits.
	f.settle(b.Jobs[0], false, 0, 10)
	b2 := f.take(queue.TakeParams{Scope: "s", Limit: 10})
	require.Equal(t, []string{"a"}, ids(b2))
	f.settle(b2.Jobs[0], true, 0, 10)
	b3 := f.take(queue.TakeParams{Scope: "s", Limit: 10})
	require.Equal(t, []string{"b"}, ids(b3))
	// A dead head unblocks its key.
	require.Equal(t, queue.StateDead, f.settle(b3.Jobs[0], false, 0, 1))
	require.Equal(t, []string{"c"}, ids(f.take(queue.TakeParams{Scope: "s", Limit: 10})))
}

func TestLeaseExpiryTakesBack(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.enqueue(entry("s", "evt_1"))
	b := f.take(queue.TakeParams{Scope: "s", Limit: 1, Lease: 20 * time.Millisecond, Worker: "dead"})
	require.Len(t, b.Jobs, 1)
	first := b.Jobs[0]

	// The taker dies: once the lease has expired by the database clock the
	// event is taken back and handed out again.
	var again queue.Batch
	deadline := time.Now().Add(10 * time.Second)
	for len(again.Jobs) == 0 && time.Now().Before(deadline) {
		again = f.take(queue.TakeParams{Scope: "s", Limit: 1, MaxAttempts: 5, Worker: "alive"})
	}
	require.Len(t, again.Jobs, 1)
	require.Equal(t, 2, again.Jobs[0].Attempt)
	require.NotEqual(t, first.Token, again.Jobs[0].Token)

	_, err := f.q.Settle(ctxT(t), queue.Settlement{ID: first.ID, Token: first.Token, Attempt: first.Attempt, Status: 200, Delivered: true})
	require.ErrorIs(t, err, queue.ErrLeaseLost, "the dead taker cannot settle")
	require.ErrorIs(t, f.q.Heartbeat(ctxT(t), first.ID, first.Token, time.Minute), queue.ErrLeaseLost)
	require.NoError(t, f.q.Heartbeat(ctxT(t), again.Jobs[0].ID, again.Jobs[0].Token, time.Minute))
	f.settle(again.Jobs[0], true, 0, 5)

	as, err := f.q.Attempts(ctxT(t), first.ID)
	require.NoError(t, err)
	require.Len(t, as, 2)
	require.Equal(t, queue.AttemptLost, as[0].Outcome)
	require.Equal(t, 200, as[0].Status, "the late answer is still recorded")
	require.Equal(t, queue.AttemptDelivered, as[1].Outcome)

	// Out of attempts when taken back: dead.
	f.enqueue(entry("s", "evt_2"))
	require.Len(t, f.take(queue.TakeParams{Scope: "s", Limit: 1, Lease: 20 * time.Millisecond}).Jobs, 1)
	deadline = time.Now().Add(10 * time.Second)
	for f.state("s", "evt_2") != queue.StateDead && time.Now().Before(deadline) {
		f.take(queue.TakeParams{Scope: "s", Limit: 1, MaxAttempts: 1})
	}
	require.Equal(t, queue.StateDead, f.state("s", "evt_2"))
}

func TestDeadRetryPurgeStats(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for i := range 3 {
		f.enqueue(entry("s", fmt.Sprintf("evt_%d", i)))
	}
	for range 2 {
		b := f.take(queue.TakeParams{Scope: "s", Limit: 10})
		require.Len(t, b.Jobs, 3)
		for _, j := range b.Jobs {
			f.settle(j, false, 0, 2)
		}
	}
	st, err := f.q.Stats(ctxT(t), "s")
	require.NoError(t, err)
	require.Equal(t, queue.Stats{Dead: 3}, st)
	evs, err := f.q.List(ctxT(t), queue.ListQuery{Scope: "s", State: queue.StateDead, Limit: 2})
	require.NoError(t, err)
	require.Len(t, evs, 2)
	more, err := f.q.List(ctxT(t), queue.ListQuery{Scope: "s", State: queue.StateDead, AfterID: evs[1].ID})
	require.NoError(t, err)
	require.Len(t, more, 1)

	// Retry one: a fresh round of two attempts.
	require.NoError(t, f.q.Retry(ctxT(t), "s", "evt_0"))
	b := f.take(queue.TakeParams{Scope: "s", Limit: 10})
	require.Len(t, b.Jobs, 1)
	require.Equal(t, 1, b.Jobs[0].RoundAttempts)
	require.Equal(t, 3, b.Jobs[0].Attempt)
	require.Equal(t, queue.StateQueued, f.settle(b.Jobs[0], false, 0, 2))

	n, err := f.q.RetryDead(ctxT(t), "s")
	require.NoError(t, err)
	require.Equal(t, 2, n)
	st, err = f.q.Stats(ctxT(t), "s")
	require.NoError(t, err)
	require.Equal(t, 3, st.Queued)
	require.Positive(t, st.OldestAge)

	b = f.take(queue.TakeParams{Scope: "s", Limit: 1})
	require.Len(t, b.Jobs, 1)
	require.ErrorIs(t, f.q.Purge(ctxT(t), "s", b.Jobs[0].EventID), queue.ErrConflict, "in delivery")
	require.NoError(t, f.q.Purge(ctxT(t), "s", "evt_2"))
	require.ErrorIs(t, f.q.Purge(ctxT(t), "s", "evt_2"), queue.ErrNotFound)
	n, err = f.q.PurgeState(ctxT(t), "s", queue.StateQueued)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	_, err = f.q.PurgeState(ctxT(t), "s", queue.StateDelivering)
	require.Error(t, err)
}

func TestRateWindow(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for i := range 5 {
		f.enqueue(entry("s", fmt.Sprintf("evt_%d", i)))
	}
	b := f.take(queue.TakeParams{Scope: "s", Limit: 10, Rate: 3, Per: time.Hour})
	require.Len(t, b.Jobs, 3)
	for _, j := range b.Jobs {
		f.settle(j, true, 0, 5)
	}
	b = f.take(queue.TakeParams{Scope: "s", Limit: 10, Rate: 3, Per: time.Hour})
	require.Empty(t, b.Jobs)
	require.True(t, b.RateLimited)
	require.InDelta(t, time.Hour.Seconds(), b.NextIn.Seconds(), 60)
}

func TestReleaseDoesNotCount(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.enqueue(entry("s", "evt_1"))
	j := f.take(queue.TakeParams{Scope: "s", Limit: 1}).Jobs[0]
	require.NoError(t, f.q.Release(ctxT(t), j.ID, j.Token, j.Attempt))
	require.ErrorIs(t, f.q.Release(ctxT(t), j.ID, j.Token, j.Attempt), queue.ErrLeaseLost)
	j2 := f.take(queue.TakeParams{Scope: "s", Limit: 1}).Jobs[0]
	require.Equal(t, 1, j2.RoundAttempts)
	require.Equal(t, 2, j2.Attempt)
	as, err := f.q.Attempts(ctxT(t), j.ID)
	require.NoError(t, err)
	require.Equal(t, queue.AttemptReleased, as[0].Outcome)
}

func TestSweep(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.enqueue(entry("s", "evt_1"))
	f.enqueue(entry("s", "evt_2"))
	b := f.take(queue.TakeParams{Scope: "s", Limit: 1})
	f.settle(b.Jobs[0], true, 0, 5)

	// keep_body: the delivered event loses its body, the queued one keeps it.
	deadline := time.Now().Add(10 * time.Second)
	stripped := 0
	for stripped == 0 && time.Now().Before(deadline) {
		_, n, err := f.q.Sweep(ctxT(t), queue.SweepParams{Scope: "s", KeepBody: time.Microsecond, Limit: 10})
		require.NoError(t, err)
		stripped += n
	}
	require.Equal(t, 1, stripped)
	ev, err := f.q.Get(ctxT(t), "s", "evt_1")
	require.NoError(t, err)
	require.False(t, ev.BodyKept)
	ev2, err := f.q.Get(ctxT(t), "s", "evt_2")
	require.NoError(t, err)
	require.True(t, ev2.BodyKept)

	// retention: delivered rows go (with their attempts); queued rows stay.
	deleted, _, err := f.q.Sweep(ctxT(t), queue.SweepParams{Scope: "other", Retention: time.Microsecond, Limit: 10})
	require.NoError(t, err)
	require.Zero(t, deleted, "other scopes are not touched")
	deleted, _, err = f.q.Sweep(ctxT(t), queue.SweepParams{Scope: "s", Retention: time.Microsecond, Limit: 10})
	require.NoError(t, err)
	require.Equal(t, 1, deleted)
	_, err = f.q.Get(ctxT(t), "s", "evt_1")
	require.ErrorIs(t, err, queue.ErrNotFound)
	require.Equal(t, queue.StateQueued, f.state("s", "evt_2"))
}

func TestNewTwice(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	_, err := pgqueue.New(ctxT(t), nil, pgqueue.Options{})
	require.ErrorContains(t, err, "no store")
	// Migrating twice is a no-op; the second queue sees the first's events.
	out := f.enqueue(entry("s", "evt_1"))
	q2, err := pgqueue.New(ctxT(t), f.store, pgqueue.Options{})
	require.NoError(t, err)
	ev, err := q2.Get(ctxT(t), "s", "evt_1")
	require.NoError(t, err)
	require.Equal(t, out.ID, ev.ID)
}

// An expired synchronous claim is the store's rule: taken over without
// on_ambiguous hold, Held with it (and nothing stored).
func TestEnqueueExpiredClaim(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for _, id := range []string{"evt_reforward", "evt_hold"} {
		c, err := f.store.Claim(ctxT(t), store.ClaimParams{Scope: "s", EventID: id, Lease: 200 * time.Millisecond})
		require.NoError(t, err)
		require.Equal(t, store.Claimed, c.Outcome)
	}
	// The lease is judged by the database clock: enqueue until it refuses
	// no more (a refused enqueue changes nothing).
	enqueueExpired := func(e queue.Entry) queue.Enqueued {
		deadline := time.Now().Add(3 * time.Second)
		for {
			out := f.enqueue(e)
			if out.Outcome != queue.InFlight {
				return out
			}
			require.True(t, time.Now().Before(deadline), "lease did not expire")
			time.Sleep(50 * time.Millisecond)
		}
	}
	require.Equal(t, queue.Queued, enqueueExpired(entry("s", "evt_reforward")).Outcome)
	ev, err := f.store.Get(ctxT(t), "s", "evt_reforward")
	require.NoError(t, err)
	require.Equal(t, store.StateCompleted, ev.State)
	require.Equal(t, 2, ev.Attempts)

	e := entry("s", "evt_hold")
	e.HoldOnExpiry = true
	out := enqueueExpired(e)
	require.Equal(t, queue.Held, out.Outcome)
	require.Equal(t, 0, out.Refused)
	_, err = f.q.Get(ctxT(t), "s", "evt_hold")
	require.ErrorIs(t, err, queue.ErrNotFound)
}

// Drop leaves nothing of a store and its queue behind: no table, index,
// sequence or function named after the events table. A migration that
// creates an object Drop does not know of fails here (the test tables of
// every package's cleanup would leak it).
func TestDropLeavesNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.enqueue(entry("s", "evt_1"))
	ctx := ctxT(t)
	pool := f.store.Pool()
	left := func() []string {
		t.Helper()
		rows, err := pool.Query(ctx, `
			SELECT relname FROM pg_class WHERE starts_with(relname, $1)
			UNION ALL
			SELECT proname || '()' FROM pg_proc WHERE starts_with(proname, $1)
			ORDER BY 1`, f.table)
		require.NoError(t, err)
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return names
	}
	before := left()
	for _, want := range []string{f.table, f.table + "_queue", f.table + "_secrets_enroll", f.table + "_claim()", f.table + "_commit()"} {
		require.Contains(t, before, want, "the migrations made it")
	}
	require.NoError(t, pgqueue.Drop(ctx, pool, f.store.Table()))
	require.Empty(t, left(), "left behind of the %d objects there were: %v", len(before), before)
}
