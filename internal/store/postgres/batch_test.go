package postgres_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store/postgres"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store/storetest"
)

// The conformance suite once more with batching off (one statement per
// operation, as InTx uses) and with batches held open 2 ms, so that the
// suite's concurrent claims share batches far more often.
func TestConformanceUnbatched(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) store.Store {
		return newStore(t, postgres.Options{Batch: store.BatchOptions{Disabled: true}})
	})
}

func TestConformanceWideBatches(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) store.Store {
		return newStore(t, postgres.Options{Batch: store.BatchOptions{MaxWait: 2 * time.Millisecond, MaxBatch: 16}})
	})
}

// sizes records the batches a store wrote (BatchOptions.Observe).
type sizes struct {
	mu sync.Mutex
	n  map[string][]int
}

func (s *sizes) observe(op string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n == nil {
		s.n = map[string][]int{}
	}
	s.n[op] = append(s.n[op], n)
}

func (s *sizes) get(op string) []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]int(nil), s.n[op]...)
}

// Ten claims of one event ID in one batch: the first is claimed, the nine
// others are in flight behind it, as if they had run one after the other.
func TestBatchSameEventInOneBatch(t *testing.T) {
	t.Parallel()
	var sz sizes
	s := newStore(t, postgres.Options{Batch: store.BatchOptions{MaxWait: 200 * time.Millisecond, MaxBatch: 10, Observe: sz.observe}})

	const n = 10
	outcomes := make([]store.Claim, n)
	var wg sync.WaitGroup
	for k := range n {
		wg.Go(func() {
			c, err := s.Claim(t.Context(), store.ClaimParams{Scope: "stripe", EventID: "evt_same", Lease: 30 * time.Second})
			require.NoError(t, err)
			outcomes[k] = c
		})
	}
	wg.Wait()
	require.Equal(t, []int{n}, sz.get("transaction"), "all ten claims in one batch")

	claimed := 0
	for _, c := range outcomes {
		switch c.Outcome {
		case store.Claimed:
			claimed++
			require.Equal(t, 1, c.Attempts)
		case store.InFlight:
			require.Equal(t, 1, c.Attempts)
			require.Equal(t, 30*time.Second, c.RetryAfter)
			require.Empty(t, c.Token)
		default:
			t.Fatalf("outcome %s", c.Outcome)
		}
	}
	require.Equal(t, 1, claimed)
	ev, err := s.Get(t.Context(), "stripe", "evt_same")
	require.NoError(t, err)
	require.Equal(t, store.StateProcessing, ev.State)
	require.Equal(t, 1, ev.Attempts)
}

// A duplicate of a completed event is answered from the read: the claim
// statement writes nothing, so the row keeps its version (xmin) and no
// transaction ID is spent.
func TestBatchCompletedDuplicateWritesNothing(t *testing.T) {
	t.Parallel()
	table := tableName()
	s := newStore(t, postgres.Options{Table: table})
	c, err := s.Claim(t.Context(), store.ClaimParams{Scope: "stripe", EventID: "evt_done", Lease: time.Minute})
	require.NoError(t, err)
	require.NoError(t, s.Complete(t.Context(), "stripe", "evt_done", c.Token, 200))

	version := func() (xmin, xmax string) {
		err := s.Pool().QueryRow(t.Context(), `SELECT xmin::text, xmax::text FROM `+pgx.Identifier{table}.Sanitize()+
			` WHERE event_id = 'evt_done'`).Scan(&xmin, &xmax)
		require.NoError(t, err)
		return xmin, xmax
	}
	xmin0, xmax0 := version()
	require.Equal(t, "0", xmax0)
	for range 5 {
		d, err := s.Claim(t.Context(), store.ClaimParams{Scope: "stripe", EventID: "evt_done", Lease: time.Minute})
		require.NoError(t, err)
		require.Equal(t, store.Duplicate, d.Outcome)
		require.Equal(t, 200, d.Status)
	}
	xmin1, xmax1 := version()
	require.Equal(t, xmin0, xmin1, "row rewritten")
	require.Equal(t, "0", xmax1, "row locked by a duplicate's claim")
}

// A batch whose connection is terminated while it waits fails every one
// of its callers (the gateway answers each 503 and forwards nothing), and
// none of its claims is committed; the next batch runs on a new connection.
func TestBatchErrorFailsEveryCaller(t *testing.T) {
	t.Parallel()
	dsn := testDSN(t)
	app := "batchtest_" + store.NewToken()[:12]
	table := tableName()
	var sz sizes
	s := newStore(t, postgres.Options{
		DSN: dsn + "&application_name=" + app, Table: table,
		Batch: store.BatchOptions{MaxWait: 200 * time.Millisecond, MaxBatch: 12, Observe: sz.observe},
	})
	// Warm the pool, and leave a claim to settle in the doomed batch.
	held, err := s.Claim(t.Context(), store.ClaimParams{Scope: "stripe", EventID: "evt_settle", Lease: time.Minute})
	require.NoError(t, err)

	// Another session locks the table, so the batch waits on it.
	locker, err := pgx.Connect(t.Context(), dsn)
	require.NoError(t, err)
	defer locker.Close(context.Background())
	tx, err := locker.Begin(t.Context())
	require.NoError(t, err)
	defer tx.Rollback(context.Background()) //nolint:errcheck // ended below
	_, err = tx.Exec(t.Context(), `LOCK TABLE `+pgx.Identifier{table}.Sanitize()+` IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)

	const n = 11
	errs := make([]error, n+1)
	var wg sync.WaitGroup
	for k := range n {
		wg.Go(func() {
			c, err := s.Claim(t.Context(), store.ClaimParams{Scope: "stripe", EventID: "evt_b" + string(rune('a'+k)), Lease: time.Minute})
			if err == nil {
				t.Errorf("claim %d answered %s during the failed batch", k, c.Outcome)
			}
			errs[k] = err
		})
	}
	wg.Go(func() { errs[n] = s.Complete(t.Context(), "stripe", "evt_settle", held.Token, 200) })

	// Terminate the gateway's backend waiting on the lock.
	require.Eventually(t, func() bool {
		var killed bool
		err := locker.QueryRow(t.Context(), `SELECT COALESCE(bool_or(pg_terminate_backend(pid)), false) FROM pg_stat_activity
			WHERE application_name = $1 AND wait_event_type = 'Lock'`, app).Scan(&killed)
		require.NoError(t, err)
		return killed
	}, 10*time.Second, 20*time.Millisecond)
	wg.Wait()
	require.NoError(t, tx.Rollback(t.Context()))

	require.Contains(t, sz.get("transaction"), n+1, "the claims and the complete were one batch")
	for k, err := range errs {
		require.Error(t, err, "caller %d", k)
		require.NotErrorIs(t, err, store.ErrLeaseLost)
	}
	for k := range n {
		_, err := s.Get(t.Context(), "stripe", "evt_b"+string(rune('a'+k)))
		require.ErrorIs(t, err, store.ErrNotFound, "a claim of the failed batch was committed")
	}
	ev, err := s.Get(t.Context(), "stripe", "evt_settle")
	require.NoError(t, err)
	require.Equal(t, store.StateProcessing, ev.State, "the complete of the failed batch was committed")

	// The store recovers: the same claims succeed now.
	c, err := s.Claim(t.Context(), store.ClaimParams{Scope: "stripe", EventID: "evt_ba", Lease: time.Minute})
	require.NoError(t, err)
	require.Equal(t, store.Claimed, c.Outcome)
	require.NoError(t, s.Complete(t.Context(), "stripe", "evt_settle", held.Token, 200))
}

// Closing the store fails the operations still queued, never blocks them.
func TestBatchClosedStore(t *testing.T) {
	t.Parallel()
	s := newStore(t, postgres.Options{})
	s2, err := postgres.New(t.Context(), postgres.Options{DSN: testDSN(t), Table: s.Table().String()})
	require.NoError(t, err)
	require.NoError(t, s2.Close())
	_, err = s2.Claim(t.Context(), store.ClaimParams{Scope: "stripe", EventID: "evt_x", Lease: time.Minute})
	require.ErrorIs(t, err, store.ErrClosed)
}

// TestClaimPlansStayOnThePrimaryKey: <table>_claim's cached plans are made
// while the table is empty (the worst case for a generic plan, which then
// weighs the retention index (scope, first_seen) as cheap as the primary
// key) and are kept as the scope grows; no claim, new or duplicate, ever
// reads the retention index, which would read the whole scope per claim.
func TestClaimPlansStayOnThePrimaryKey(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	// One connection, so every claim runs on the session whose plans were
	// cached on the empty table.
	s := newStore(t, postgres.Options{MaxConns: 1, Batch: store.BatchOptions{MaxWait: time.Millisecond}})
	name := s.Table().Name
	table := pgx.Identifier{name}.Sanitize()
	claim := func(prefix string, n int) {
		var wg sync.WaitGroup
		for k := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := s.Claim(ctx, store.ClaimParams{Scope: "stripe", EventID: fmt.Sprintf("%s_%d", prefix, k), Lease: time.Minute})
				assert.NoError(t, err)
			}()
		}
		wg.Wait()
	}
	for range 10 { // past PL/pgSQL's five custom plans, on the empty table
		claim("first", 8)
		_, err := s.Pool().Exec(ctx, "DELETE FROM "+table)
		require.NoError(t, err)
	}
	_, err := s.Pool().Exec(ctx, "INSERT INTO "+table+` (scope, event_id, state, status, completed_at)
		SELECT 'stripe', 'old_' || g, 'completed', 200, now() FROM generate_series(1, 5000) g`)
	require.NoError(t, err)
	claim("new", 16)
	claim("new", 16) // duplicates: answered from the read
	claim("old", 16)

	var scans, pkScans int64
	require.Eventually(t, func() bool {
		// The claims' backend reports its counters when idle, within a second.
		require.NoError(t, s.Pool().QueryRow(ctx, `SELECT
				coalesce(sum(idx_scan) FILTER (WHERE indexrelname = $1), 0),
				coalesce(sum(idx_scan) FILTER (WHERE indexrelname = $2), 0)
			FROM pg_stat_user_indexes`, name+"_scope_first_seen_idx", name+"_pkey").Scan(&scans, &pkScans))
		return pkScans >= 48
	}, 10*time.Second, 100*time.Millisecond)
	require.Zero(t, scans, "claims read the retention index (scope, first_seen)")
}
