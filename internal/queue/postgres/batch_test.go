package postgres_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
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

// Batched enqueues. Each test makes its batches deterministic without
// timing: an uncommitted row of a test transaction holds the first
// enqueue's batch inside its statement (the claim waits for that row), the
// enqueues that must share the next batch are queued one by one behind it
// (QueuedEnqueues), and the row is then committed or rolled back.

// sizes records the batch sizes a queue observes.
type sizes struct {
	mu sync.Mutex
	n  []int
}

func (s *sizes) observe(op string, n int) {
	if op != "enqueue" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n = append(s.n, n)
}

func (s *sizes) get() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.n)
}

func newBatchFixture(t *testing.T) (*fixture, *sizes) {
	t.Helper()
	sz := &sizes{}
	tt := queuetest.New(t, "qb_", pgstore.Options{MaxConns: 20},
		pgqueue.Options{Batch: pgqueue.BatchOptions{Observe: sz.observe}})
	return &fixture{t: t, store: tt.Store, q: tt.Queue, table: tt.Name}, sz
}

type result struct {
	out queue.Enqueued
	err error
}

// enqueueAsync enqueues e on q in the background.
func (f *fixture) enqueueAsync(q *pgqueue.Queue, e queue.Entry) chan result {
	ch := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out, err := q.Enqueue(ctx, e)
		ch <- result{out, err}
	}()
	return ch
}

// queueBehind enqueues es in the background, one after the other in
// arrival order, each queued behind the batch being written.
func (f *fixture) queueBehind(es ...queue.Entry) []chan result {
	f.t.Helper()
	base := pgqueue.QueuedEnqueues(f.q)
	out := make([]chan result, len(es))
	for i, e := range es {
		out[i] = f.enqueueAsync(f.q, e)
		f.waitFor(fmt.Sprintf("%d enqueues queued", base+i+1), func() bool { return pgqueue.QueuedEnqueues(f.q) == base+i+1 })
	}
	return out
}

func (f *fixture) waitFor(what string, cond func() bool) {
	f.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		require.True(f.t, time.Now().Before(deadline), "waited in vain for %s", what)
		time.Sleep(2 * time.Millisecond)
	}
}

// hold inserts a row of the events table in a transaction left open, so a
// claim of that key waits in its statement; lease > 0 makes it a live
// claim, else a released row. The caller commits or rolls back.
func (f *fixture) hold(scope, id string, lease time.Duration) pgx.Tx {
	f.t.Helper()
	tx, err := f.store.Pool().Begin(ctxT(f.t))
	require.NoError(f.t, err)
	f.t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	state := "released"
	if lease > 0 {
		state = "processing"
	}
	_, err = tx.Exec(ctxT(f.t), `INSERT INTO `+pgx.Identifier{f.table}.Sanitize()+`
		(scope, event_id, state, token, attempts, lease_until)
		VALUES ($1, $2, $3, 'tok', 1, CASE WHEN $4::bigint > 0 THEN now() + $4::bigint * interval '1 microsecond' END)`,
		scope, id, state, lease.Microseconds())
	require.NoError(f.t, err)
	return tx
}

// waitBlocked waits until a statement on this test's tables waits for a
// lock: the batch being written is held by a hold row.
func (f *fixture) waitBlocked() {
	f.t.Helper()
	f.waitFor("a batch waiting for a row lock", func() bool {
		var n int
		require.NoError(f.t, f.store.Pool().QueryRow(ctxT(f.t), `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%'`, f.table).Scan(&n))
		return n > 0
	})
}

// startBlocked starts an enqueue whose batch waits on a hold row, and
// returns that row's transaction and the enqueue's result.
func (f *fixture) startBlocked(scope, id string, lease time.Duration) (pgx.Tx, chan result) {
	f.t.Helper()
	tx := f.hold(scope, id, lease)
	ch := f.enqueueAsync(f.q, entry(scope, id))
	f.waitBlocked()
	return tx, ch
}

func (f *fixture) queueRows(scope string) []queue.Event {
	f.t.Helper()
	evs, err := f.q.List(ctxT(f.t), queue.ListQuery{Scope: scope, Limit: 1000})
	require.NoError(f.t, err)
	return evs
}

// Concurrent enqueues of distinct events share one transaction, and each
// is committed (seen from other connections) when Enqueue returns.
func TestEnqueueBatchSharesTransaction(t *testing.T) {
	t.Parallel()
	f, sz := newBatchFixture(t)
	blocker, first := f.startBlocked("s", "evt_000", 0)
	const n = 40
	var es []queue.Entry
	for i := 1; i <= n; i++ {
		es = append(es, entry("s", fmt.Sprintf("evt_%03d", i)))
	}
	rs := f.queueBehind(es...)
	require.NoError(t, blocker.Commit(ctxT(t)))

	r := <-first
	require.NoError(t, r.err)
	require.Equal(t, queue.Queued, r.out.Outcome, "the released row is taken over")
	ids := map[int64]bool{r.out.ID: true}
	for i, ch := range rs {
		r := <-ch
		require.NoError(t, r.err)
		require.Equal(t, queue.Queued, r.out.Outcome)
		require.False(t, ids[r.out.ID], "IDs are distinct")
		ids[r.out.ID] = true
		ev, err := f.q.Get(ctxT(t), "s", es[i].EventID)
		require.NoError(t, err, "committed before Enqueue returned")
		require.Equal(t, r.out.ID, ev.ID)
		c, err := f.store.Get(ctxT(t), "s", es[i].EventID)
		require.NoError(t, err)
		require.Equal(t, store.StateCompleted, c.State)
		require.Equal(t, 202, c.Status)
	}
	require.Equal(t, []int{1, n}, sz.get(), "one transaction for the %d enqueues queued behind the first", n)
	require.Len(t, f.queueRows("s"), n+1)
}

// In one batch each entry gets its own outcome, as if enqueued one after
// the other in arrival order; a refused claim stores nothing of its entry
// and changes nothing for the others.
func TestEnqueueBatchOutcomesAreEach(t *testing.T) {
	t.Parallel()
	f, sz := newBatchFixture(t)
	ctx := ctxT(t)
	// A live synchronous claim, a held event, a live claim on a body key,
	// an event queued before whose claim an operator forgot.
	_, err := f.store.Claim(ctx, store.ClaimParams{Scope: "s", EventID: "evt_live", Lease: time.Minute})
	require.NoError(t, err)
	c, err := f.store.Claim(ctx, store.ClaimParams{Scope: "s", EventID: "evt_held", Lease: time.Minute})
	require.NoError(t, err)
	require.NoError(t, f.store.Hold(ctx, "s", "evt_held", c.Token, "test: held"))
	_, err = f.store.Claim(ctx, store.ClaimParams{Scope: "s#body", EventID: "h_live", Lease: time.Minute})
	require.NoError(t, err)
	require.Equal(t, queue.Queued, f.enqueue(entry("s", "evt_old")).Outcome)
	require.NoError(t, f.store.Forget(ctx, "s", "evt_old"))

	withBody := func(id, hash string) queue.Entry {
		e := entry("s", id)
		e.Claims = append(e.Claims, queue.Key{Scope: "s#body", EventID: hash})
		return e
	}
	blocker, first := f.startBlocked("s", "evt_first", 0)
	rs := f.queueBehind(
		entry("s", "evt_dup"),        // 0: queued
		entry("s", "evt_dup"),        // 1: its duplicate, in the same batch
		entry("s", "evt_live"),       // 2: in flight
		entry("s", "evt_ok"),         // 3: queued
		withBody("evt_b1", "h1"),     // 4: queued
		withBody("evt_b2", "h1"),     // 5: same body: a duplicate by its second claim
		withBody("evt_bl", "h_live"), // 6: its body's claim is live
		entry("s", "evt_held"),       // 7: held
		entry("s", "evt_old"),        // 8: the queue row exists
	)
	require.NoError(t, blocker.Commit(ctx))
	require.Equal(t, queue.Queued, (<-first).out.Outcome)
	got := make([]queue.Enqueued, len(rs))
	for i, ch := range rs {
		r := <-ch
		require.NoError(t, r.err, "entry %d", i)
		got[i] = r.out
	}
	require.Equal(t, []int{1, 1, len(rs)}, sz.get(), "evt_old alone, the first, then the rest in one batch")

	require.Equal(t, queue.Queued, got[0].Outcome)
	require.Equal(t, queue.Enqueued{Outcome: queue.Duplicate, Refused: 0}, got[1])
	require.Equal(t, queue.InFlight, got[2].Outcome)
	require.Equal(t, 0, got[2].Refused)
	require.GreaterOrEqual(t, got[2].RetryAfter, 50*time.Second)
	require.Equal(t, queue.Queued, got[3].Outcome)
	require.Equal(t, queue.Queued, got[4].Outcome)
	require.Equal(t, queue.Enqueued{Outcome: queue.Duplicate, Refused: 1}, got[5])
	require.Equal(t, queue.InFlight, got[6].Outcome)
	require.Equal(t, 1, got[6].Refused)
	require.Equal(t, queue.Enqueued{Outcome: queue.Held, Refused: 0}, got[7])
	require.Equal(t, queue.Enqueued{Outcome: queue.Duplicate, Refused: -1}, got[8])

	var queued []string
	for _, ev := range f.queueRows("s") {
		queued = append(queued, ev.EventID)
	}
	require.ElementsMatch(t, []string{"evt_old", "evt_first", "evt_dup", "evt_ok", "evt_b1"}, queued,
		"one row for evt_dup; none for the refused entries")
	require.Less(t, got[0].ID, got[3].ID, "queue IDs follow arrival order")
	require.Less(t, got[3].ID, got[4].ID)

	// Nothing of a refused entry is stored: not even its claims that were
	// not refused; the rows that refused are as they were.
	for _, id := range []string{"evt_b2", "evt_bl"} {
		_, err := f.store.Get(ctx, "s", id)
		require.ErrorIs(t, err, store.ErrNotFound, id)
	}
	// evt_old found its queue row: its claim is kept.
	for id, want := range map[string]store.State{"evt_live": store.StateProcessing, "evt_held": store.StateHeld, "evt_old": store.StateCompleted} {
		ev, err := f.store.Get(ctx, "s", id)
		require.NoError(t, err, id)
		require.Equal(t, want, ev.State, id)
	}
	body, err := f.store.Get(ctx, "s#body", "h1")
	require.NoError(t, err)
	require.Equal(t, store.StateCompleted, body.State)
	require.Equal(t, 1, body.Attempts, "claimed once, by evt_b1")
}

// A batch that fails fails every entry in it, and none is stored: neither
// its queue row nor its claims.
func TestEnqueueBatchStoreError(t *testing.T) {
	t.Parallel()
	f, _ := newBatchFixture(t)
	ctx := ctxT(t)
	// A constraint the database enforces, as a schema change or a full
	// disk would fail a statement: the queue row of evt_poison is refused.
	queueTable := pgx.Identifier{f.table + "_queue"}.Sanitize()
	_, err := f.store.Pool().Exec(ctx, `ALTER TABLE `+queueTable+` ADD CONSTRAINT no_poison CHECK (event_id <> 'evt_poison')`)
	require.NoError(t, err)

	blocker, first := f.startBlocked("s", "evt_first", 0)
	ordered := entry("s", "evt_3")
	ordered.OrderKey = "k"
	es := []queue.Entry{entry("s", "evt_1"), entry("s", "evt_poison"), ordered, entry("s", "evt_4")}
	rs := f.queueBehind(es...)
	require.NoError(t, blocker.Commit(ctx))
	require.Equal(t, queue.Queued, (<-first).out.Outcome)
	for i, ch := range rs {
		r := <-ch
		require.Error(t, r.err, "entry %d", i)
		require.ErrorContains(t, r.err, "enqueueing event")
		_, err := f.q.Get(ctx, "s", es[i].EventID)
		require.ErrorIs(t, err, queue.ErrNotFound)
		_, err = f.store.Get(ctx, "s", es[i].EventID)
		require.ErrorIs(t, err, store.ErrNotFound, "the claim is rolled back with the batch")
	}

	// The failure was the batch's only: the same entries queue afterwards.
	_, err = f.store.Pool().Exec(ctx, `ALTER TABLE `+queueTable+` DROP CONSTRAINT no_poison`)
	require.NoError(t, err)
	for _, e := range es {
		require.Equal(t, queue.Queued, f.enqueue(e).Outcome)
	}
}

// Queue IDs follow arrival order within an order key, in one batch and
// across concurrent batches of two queue instances, and the dispatcher's
// take hands a key's events out one at a time in that order.
func TestEnqueueBatchOrderKeys(t *testing.T) {
	t.Parallel()
	f, _ := newBatchFixture(t)
	ctx := ctxT(t)

	// One batch: k's events in arrival order around others.
	ordered := func(id, key string) queue.Entry {
		e := entry("s", id)
		e.OrderKey = key
		return e
	}
	// a4 shares a body key with a refused entry, so it is written in a
	// later round of the batch than the one before it: a5, after it, too.
	_, err := f.store.Claim(ctx, store.ClaimParams{Scope: "s", EventID: "live", Lease: time.Minute})
	require.NoError(t, err)
	withBody := func(e queue.Entry, hash string) queue.Entry {
		e.Claims = append(e.Claims, queue.Key{Scope: "s#body", EventID: hash})
		return e
	}
	blocker, first := f.startBlocked("s", "evt_first", 0)
	rs := f.queueBehind(ordered("a1", "k"), entry("s", "u1"), ordered("a2", "k"), ordered("b1", "j"), ordered("a3", "k"),
		withBody(entry("s", "live"), "h"), withBody(ordered("a4", "k"), "h"), ordered("a5", "k"))
	require.NoError(t, blocker.Commit(ctx))
	require.Equal(t, queue.Queued, (<-first).out.Outcome)
	var ids []int64
	for i, ch := range rs {
		r := <-ch
		require.NoError(t, r.err)
		if i == 5 {
			require.Equal(t, queue.InFlight, r.out.Outcome)
			continue
		}
		require.Equal(t, queue.Queued, r.out.Outcome)
		ids = append(ids, r.out.ID)
	}
	for _, pair := range [][2]int{{0, 2}, {2, 4}, {4, 5}, {5, 6}} { // a1 < a2 < a3 < a4 < a5
		require.Less(t, ids[pair[0]], ids[pair[1]])
	}

	// Concurrent batches of two instances: each key's events are enqueued
	// in sequence, alternately through either instance.
	q2, err := pgqueue.New(ctx, f.store, pgqueue.Options{})
	require.NoError(t, err)
	t.Cleanup(q2.Close)
	const keys, per = 4, 15
	var wg sync.WaitGroup
	errs := make(chan error, keys*per+2*per)
	for k := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var last int64
			for i := range per {
				q := f.q
				if i%2 == 1 {
					q = q2
				}
				out, err := q.Enqueue(ctx, ordered(fmt.Sprintf("k%d_%02d", k, i), fmt.Sprintf("key%d", k)))
				switch {
				case err != nil:
					errs <- err
				case out.Outcome != queue.Queued:
					errs <- fmt.Errorf("k%d_%02d: %v", k, i, out.Outcome)
				case out.ID <= last:
					errs <- fmt.Errorf("k%d_%02d: ID %d after %d", k, i, out.ID, last)
				}
				last = out.ID
			}
		}()
	}
	for u := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				if _, err := f.q.Enqueue(ctx, entry("s", fmt.Sprintf("u%d_%02d", u, i))); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	// Deliver everything: never two events of a key in delivery, each key
	// in its order.
	next := map[string]int{}
	for range keys*per + 2*per + 10 {
		b := f.take(queue.TakeParams{Scope: "s", Limit: 100})
		if len(b.Jobs) == 0 {
			break
		}
		seen := map[string]bool{}
		for _, j := range b.Jobs {
			if j.OrderKey != "" && j.OrderKey != "k" && j.OrderKey != "j" {
				require.False(t, seen[j.OrderKey], "two events of %s at once", j.OrderKey)
				seen[j.OrderKey] = true
				require.Equal(t, fmt.Sprintf("k%s_%02d", j.OrderKey[3:], next[j.OrderKey]), j.EventID)
				next[j.OrderKey]++
			}
			f.settle(j, true, 0, 5)
		}
	}
	for k := range keys {
		require.Equal(t, per, next[fmt.Sprintf("key%d", k)])
	}
}

// When a row a batch read as claimable changed before its write (another
// instance's claim committed in between), the batch is rolled back and its
// entries are enqueued one by one: the outcome is the one the row gives,
// and nothing of the refused entry is kept.
func TestEnqueueBatchRowChangedUnderIt(t *testing.T) {
	t.Parallel()
	f, _ := newBatchFixture(t)
	ctx := ctxT(t)

	blocker, ch := f.startBlocked("s", "evt_race", time.Minute)
	require.NoError(t, blocker.Commit(ctx))
	r := <-ch
	require.NoError(t, r.err)
	require.Equal(t, queue.InFlight, r.out.Outcome)
	require.GreaterOrEqual(t, r.out.RetryAfter, 50*time.Second)
	_, err := f.q.Get(ctx, "s", "evt_race")
	require.ErrorIs(t, err, queue.ErrNotFound)

	// The second claim's row changes: the first, written by the batch, is
	// rolled back with it.
	blocker = f.hold("s#body", "h_race", time.Minute)
	e := entry("s", "evt_r2")
	e.Claims = append(e.Claims, queue.Key{Scope: "s#body", EventID: "h_race"})
	ch = f.enqueueAsync(f.q, e)
	f.waitBlocked()
	require.NoError(t, blocker.Commit(ctx))
	r = <-ch
	require.NoError(t, r.err)
	require.Equal(t, queue.InFlight, r.out.Outcome)
	require.Equal(t, 1, r.out.Refused)
	_, err = f.store.Get(ctx, "s", "evt_r2")
	require.ErrorIs(t, err, store.ErrNotFound)
	_, err = f.q.Get(ctx, "s", "evt_r2")
	require.ErrorIs(t, err, queue.ErrNotFound)
}

// The batch writes an event's claim as the store's Claim then Complete
// leave it (one transaction per enqueue, unbatched): fresh, over a
// released row (with a fingerprint), over an expired claim.
func TestEnqueueBatchWritesClaimAsStore(t *testing.T) {
	t.Parallel()
	f, _ := newBatchFixture(t)
	ctx := ctxT(t)
	one, err := pgqueue.New(ctx, f.store, pgqueue.Options{Batch: pgqueue.BatchOptions{Disabled: true}})
	require.NoError(t, err)
	t.Cleanup(one.Close)
	table := pgx.Identifier{f.table}.Sanitize()

	for _, id := range []string{"released", "expired"} {
		for _, via := range []string{"batch", "one"} {
			_, err := f.store.Claim(ctx, store.ClaimParams{Scope: "s", EventID: id + "_" + via, Lease: time.Minute, Fingerprint: "fp"})
			require.NoError(t, err)
		}
		next := `state = 'released', token = '', lease_until = NULL`
		if id == "expired" {
			next = `lease_until = now() - interval '1 second'`
		}
		_, err := f.store.Pool().Exec(ctx, `UPDATE `+table+` SET `+next+`, response_headers = '{}', response_size = 3
			WHERE event_id LIKE $1`, id+"_%")
		require.NoError(t, err)
	}
	for _, id := range []string{"fresh", "released", "expired"} {
		before, _ := f.store.Get(ctx, "s", id+"_batch")
		var evs [2]store.Event
		for i, q := range []*pgqueue.Queue{f.q, one} {
			via := []string{"batch", "one"}[i]
			out, err := q.Enqueue(ctx, entry("s", id+"_"+via))
			require.NoError(t, err)
			require.Equal(t, queue.Queued, out.Outcome, id+" via "+via)
			evs[i], err = f.store.Get(ctx, "s", id+"_"+via)
			require.NoError(t, err)
		}
		b, o := evs[0], evs[1]
		require.Equal(t, store.StateCompleted, b.State, id)
		require.Equal(t, o.Attempts, b.Attempts, id)
		require.Equal(t, o.Status, b.Status, id)
		require.Equal(t, o.Fingerprint, b.Fingerprint, id)
		require.Equal(t, o.Response, b.Response, id)
		require.True(t, b.LeaseUntil.IsZero(), id)
		require.False(t, b.CompletedAt.IsZero(), id)
		if id != "fresh" {
			require.Equal(t, 2, b.Attempts, id)
			require.True(t, before.FirstSeen.Equal(b.FirstSeen), "%s: first seen kept", id)
		}
	}
}

// An entry PostgreSQL could not store as text is refused on its own,
// before it could fail a batch; a closed queue refuses enqueues.
func TestEnqueueRefusedBeforeBatch(t *testing.T) {
	t.Parallel()
	f, sz := newBatchFixture(t)
	ctx := ctxT(t)
	e := entry("s", "evt_bytes")
	e.Request.URI = "/hooks?x=\xff"
	_, err := f.q.Enqueue(ctx, e)
	require.ErrorIs(t, err, pgqueue.ErrNotText)
	require.Empty(t, sz.get(), "it never joined a batch")
	require.Equal(t, queue.Queued, f.enqueue(entry("s", "evt_ok")).Outcome)

	q2, err := pgqueue.New(ctx, f.store, pgqueue.Options{})
	require.NoError(t, err)
	q2.Close()
	_, err = q2.Enqueue(ctx, entry("s", "evt_late"))
	require.ErrorIs(t, err, pgqueue.ErrClosed)
}
