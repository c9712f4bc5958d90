package postgres_test

import (
	"context"
	"fmt"
	"strings"
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
	claim := func(prefix string, n int) []store.Claim {
		var wg sync.WaitGroup
		claims := make([]store.Claim, n)
		for k := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var err error
				claims[k], err = s.Claim(ctx, store.ClaimParams{Scope: "stripe", EventID: fmt.Sprintf("%s_%d", prefix, k), Lease: time.Minute})
				assert.NoError(t, err)
			}()
		}
		wg.Wait()
		return claims
	}
	for range 10 { // past PL/pgSQL's five custom plans, on the empty table
		claim("first", 8)
		_, err := s.Pool().Exec(ctx, "DELETE FROM "+table)
		require.NoError(t, err)
	}
	_, err := s.Pool().Exec(ctx, "INSERT INTO "+table+` (scope, event_id, state, status, completed_at)
		SELECT 'stripe', 'old_' || g, 'completed', 200, now() FROM generate_series(1, 5000) g`)
	require.NoError(t, err)
	claims := claim("new", 16)
	claim("new", 16) // duplicates: answered from the read
	claim("old", 16)
	// and the batched completions of the new ones
	var wg sync.WaitGroup
	for k, c := range claims {
		require.Equal(t, store.Claimed, c.Outcome)
		wg.Go(func() { assert.NoError(t, s.Complete(ctx, "stripe", fmt.Sprintf("new_%d", k), c.Token, 200)) })
	}
	wg.Wait()

	var scans, pkScans int64
	require.Eventually(t, func() bool {
		// The claims' backend reports its counters when idle, within a second.
		require.NoError(t, s.Pool().QueryRow(ctx, `SELECT
				coalesce(sum(idx_scan) FILTER (WHERE indexrelname = $1), 0),
				coalesce(sum(idx_scan) FILTER (WHERE indexrelname = $2), 0)
			FROM pg_stat_user_indexes`, name+"_scope_first_seen_idx", name+"_pkey").Scan(&scans, &pkScans))
		return pkScans >= 49
	}, 10*time.Second, 100*time.Millisecond)
	require.Zero(t, scans, "claims or completions read the retention index (scope, first_seen)")
}

// One batch of settles, as the driver receives it: each settle is judged
// by its own token, also when a key is settled twice (a stale token next
// to the live one, in either order), across scopes, statuses and kinds.
func TestBatchSettlesJudgedByTheirOwnTokens(t *testing.T) {
	t.Parallel()
	s := newStore(t, postgres.Options{Batch: store.BatchOptions{Disabled: true}})
	ctx := t.Context()
	token := map[string]string{}
	for _, key := range []string{"stripe/evt_a", "stripe/evt_b", "stripe/evt_c", "stripe/evt_d", "stripe/evt_e", "github/evt_a", "stripe/evt_f"} {
		scope, id, _ := strings.Cut(key, "/")
		c, err := s.Claim(ctx, store.ClaimParams{Scope: scope, EventID: id, Lease: time.Minute})
		require.NoError(t, err)
		require.Equal(t, store.Claimed, c.Outcome)
		token[key] = c.Token
	}
	stale := store.NewToken()
	settle := func(stmt store.Stmt, key, tok string, status int, reason string) store.BatchSettle {
		scope, id, _ := strings.Cut(key, "/")
		return store.BatchSettle{Stmt: stmt, Scope: scope, EventID: id, Token: tok, Status: status, Reason: reason}
	}
	b := store.Batch{Settles: []store.BatchSettle{
		settle(store.StmtComplete, "stripe/evt_a", stale, 200, ""), // stale token before the live one
		settle(store.StmtComplete, "stripe/evt_a", token["stripe/evt_a"], 200, ""),
		settle(store.StmtComplete, "stripe/evt_b", token["stripe/evt_b"], 200, ""),
		settle(store.StmtComplete, "stripe/evt_f", token["stripe/evt_f"], 201, ""), // live token before the stale one
		settle(store.StmtComplete, "stripe/evt_f", stale, 201, ""),
		settle(store.StmtComplete, "stripe/evt_c", stale, 200, ""),
		settle(store.StmtRelease, "stripe/evt_d", token["stripe/evt_d"], 0, ""),
		settle(store.StmtHold, "stripe/evt_e", token["stripe/evt_e"], 0, "upstream_timeout"),
		settle(store.StmtComplete, "github/evt_a", token["github/evt_a"], 202, ""),
	}}
	require.NoError(t, postgres.Driver(s).(store.BatchDriver).WriteBatch(ctx, &b))
	changed := make([]bool, len(b.Settles))
	for n, st := range b.Settles {
		changed[n] = st.Changed
	}
	require.Equal(t, []bool{false, true, true, true, false, false, true, true, true}, changed)

	for key, want := range map[string]struct {
		state  store.State
		status int
	}{
		"stripe/evt_a": {store.StateCompleted, 200}, "stripe/evt_b": {store.StateCompleted, 200},
		"stripe/evt_f": {store.StateCompleted, 201}, "stripe/evt_c": {store.StateProcessing, 0},
		"stripe/evt_d": {store.StateReleased, 0}, "stripe/evt_e": {store.StateHeld, 0},
		"github/evt_a": {store.StateCompleted, 202},
	} {
		scope, id, _ := strings.Cut(key, "/")
		ev, err := s.Get(ctx, scope, id)
		require.NoError(t, err)
		assert.Equal(t, want.state, ev.State, key)
		assert.Equal(t, want.status, ev.Status, key)
	}

	// One scope and status throughout, the stale settle of the repeated
	// key first (a statement per scope and status that took each key's
	// first token would miss the live one: measured and not kept).
	b = store.Batch{}
	for _, id := range []string{"evt_x", "evt_x", "evt_y", "evt_z", "evt_w"} {
		c, err := s.Claim(ctx, store.ClaimParams{Scope: "shopify", EventID: id, Lease: time.Minute})
		require.NoError(t, err)
		tok := c.Token
		if c.Outcome != store.Claimed {
			tok = b.Settles[0].Token
			b.Settles[0].Token = stale
		}
		b.Settles = append(b.Settles, store.BatchSettle{Stmt: store.StmtComplete, Scope: "shopify", EventID: id, Token: tok, Status: 200})
	}
	require.NoError(t, postgres.Driver(s).(store.BatchDriver).WriteBatch(ctx, &b))
	for n, want := range []bool{false, true, true, true, true} {
		assert.Equal(t, want, b.Settles[n].Changed, n)
	}
	ev, err := s.Get(ctx, "shopify", "evt_x")
	require.NoError(t, err)
	require.Equal(t, store.StateCompleted, ev.State)
}
