package postgres_test

import (
	"context"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/e2e"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store/postgres"
)

// retries counts a store's RetryObserver calls by reason.
type retries struct {
	mu sync.Mutex
	n  map[string]int
}

func (r *retries) observe(reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n = map[string]int{}
	}
	r.n[reason]++
}

func (r *retries) count(reason string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[reason]
}

// via returns dsn with its server reached through a relay on 127.0.0.1,
// closed at the end of the test.
func via(t *testing.T, dsn string) (*e2e.Link, string) {
	t.Helper()
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	host := u.Host
	if u.Port() == "" {
		host += ":5432"
	}
	link, err := e2e.NewLink(host)
	require.NoError(t, err)
	t.Cleanup(link.Close)
	u.Host = link.Addr()
	return link, u.String()
}

// eachBatchingVia runs f, batched and unbatched, on a store that reaches
// PostgreSQL through a relay (via), counting the store's retries.
func eachBatchingVia(t *testing.T, f func(t *testing.T, link *e2e.Link, s *postgres.Store, r *retries)) {
	for _, batched := range []bool{true, false} {
		t.Run(map[bool]string{true: "batched", false: "unbatched"}[batched], func(t *testing.T) {
			t.Parallel()
			link, dsn := via(t, testDSN(t))
			r := new(retries)
			f(t, link, newStore(t, postgres.Options{DSN: dsn, StatementTimeout: time.Second,
				Retried: r.observe, Batch: store.BatchOptions{Disabled: !batched}}), r)
		})
	}
}

// A claim whose statement committed but whose answer never came back (the
// relay drops the replies of the flows open then, as a NAT that forgot
// them) is tried once more, on a new connection, with the same token: the
// row it finds under that token is its own, so it is Claimed (attempts 1),
// its token settles it, and nobody else may claim the event.
func TestClaimRetryFindsItsOwnToken(t *testing.T) {
	t.Parallel()
	eachBatchingVia(t, func(t *testing.T, link *e2e.Link, s *postgres.Store, r *retries) {
		ctx := t.Context()
		p := store.ClaimParams{Scope: "s", EventID: "warm", Lease: time.Minute}
		_, err := s.Claim(ctx, p) // one connection, used again at once (no ping)
		require.NoError(t, err)

		link.DropReplies()
		t0 := time.Now()
		p.EventID = "e"
		c, err := s.Claim(ctx, p)
		took := time.Since(t0)
		require.NoError(t, err)
		require.Equal(t, store.Claimed, c.Outcome, "the row under its own token is its own")
		require.Equal(t, 1, c.Attempts, "claimed once")
		require.Equal(t, 1, r.count(store.RetryConnection), "tried once more")
		require.Less(t, took, 5*time.Second, "within a delivery's store timeout")

		other, err := s.Claim(ctx, p)
		require.NoError(t, err)
		require.Equal(t, store.InFlight, other.Outcome, "another delivery may not claim it")
		require.NoError(t, s.Complete(ctx, "s", "e", c.Token, 200), "its token holds the row")
		ev, err := s.Get(ctx, "s", "e")
		require.NoError(t, err)
		require.Equal(t, store.StateCompleted, ev.State)
		require.Equal(t, 1, ev.Attempts)
		t.Logf("claim with its answer lost: claimed after %s", took.Round(time.Millisecond))
	})
}

// A completion whose answer was lost is written once more; when that
// changes no row, the store cannot tell its own first try from another
// claim that took the row over and completed it alike (same status): it
// reports the lost connection (outcome unknown), never success. A trial
// saw a gateway log "settled" for events another gateway had taken over
// and run again. claim.Keeper decides with the claim's attempts.
func TestSettleRetryFindingNoRowIsUnknown(t *testing.T) {
	t.Parallel()
	eachBatchingVia(t, func(t *testing.T, link *e2e.Link, s *postgres.Store, r *retries) {
		ctx := t.Context()
		p := store.ClaimParams{Scope: "s", EventID: "e", Lease: 50 * time.Millisecond}
		first, err := s.Claim(ctx, p)
		require.NoError(t, err)
		time.Sleep(100 * time.Millisecond) // the lease expires
		p.Lease = time.Minute
		taken, err := s.Claim(ctx, p)
		require.NoError(t, err)
		require.Equal(t, store.Claimed, taken.Outcome)
		require.NoError(t, s.Complete(ctx, "s", "e", taken.Token, 200))

		link.DropReplies()
		err = s.Complete(ctx, "s", "e", first.Token, 200)
		require.ErrorIs(t, err, store.ErrConnectionLost, "not its own completion: outcome unknown, not success")
		require.Equal(t, 1, r.count(store.RetryConnection), "written once more")
		ev, err := s.Get(ctx, "s", "e")
		require.NoError(t, err)
		require.Equal(t, 2, ev.Attempts, "the row is the takeover's")
	})
}

// Every connection of the pool black-holed (a NAT that dropped its flows;
// new flows work): deliveries' claims, on connections used again at once
// (the statement deadline finds them) or idle for a while (the ping before
// use finds them), are all claimed, once each, within a delivery's store
// timeout.
func TestClaimsSurviveBlackHoledConnections(t *testing.T) {
	t.Parallel()
	for _, idle := range []time.Duration{0, 1500 * time.Millisecond} {
		t.Run("idle="+idle.String(), func(t *testing.T) {
			t.Parallel()
			link, dsn := via(t, testDSN(t))
			s := newStore(t, postgres.Options{DSN: dsn})
			ctx := t.Context()
			// Warm up: several connections open.
			var wg sync.WaitGroup
			for i := range 8 {
				wg.Go(func() {
					_, err := s.Claim(ctx, store.ClaimParams{Scope: "s", EventID: "warm" + string(rune('a'+i)), Lease: time.Minute})
					require.NoError(t, err)
				})
			}
			wg.Wait()

			link.BlackHole()
			time.Sleep(idle)
			var (
				mu      sync.Mutex
				slowest time.Duration
			)
			for i := range 8 {
				wg.Go(func() {
					t0 := time.Now()
					sctx, cancel := context.WithTimeout(ctx, 5*time.Second) // a delivery's store timeout
					defer cancel()
					c, err := s.Claim(sctx, store.ClaimParams{Scope: "s", EventID: "e" + string(rune('a'+i)), Lease: time.Minute})
					require.NoError(t, err, "claim %d", i)
					require.Equal(t, store.Claimed, c.Outcome)
					require.Equal(t, 1, c.Attempts)
					mu.Lock()
					slowest = max(slowest, time.Since(t0))
					mu.Unlock()
				})
			}
			wg.Wait()
			t.Logf("8 claims after the pool's flows were black-holed (idle %s): slowest %s", idle, slowest.Round(time.Millisecond))
		})
	}
}

// Instances starting together on a database whose default isolation is
// SERIALIZABLE all migrate (the migration transaction reads the history
// after its lock, READ COMMITTED whatever the default), and the history
// holds each version once; a storm of claims of one event there (each
// statement its own SERIALIZABLE transaction) has one winner and no error:
// the transactions rolled back by a conflict run again.
func TestSerializableDatabase(t *testing.T) {
	t.Parallel()
	admin := testDSN(t)
	ctx := t.Context()
	db, err := e2e.CreateDatabase(ctx, admin, "store_serializable")
	require.NoError(t, err)
	t.Cleanup(func() {
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = db.Drop(dctx)
	})
	conn, err := pgx.Connect(ctx, admin)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{db.Name}.Sanitize()+" SET default_transaction_isolation = serializable")
	require.NoError(t, err)
	require.NoError(t, conn.Close(ctx))

	var r retries
	const n = 4
	stores := make([]*postgres.Store, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			stores[i], errs[i] = postgres.New(ctx, postgres.Options{DSN: db.DSN, Retried: r.observe})
		})
	}
	wg.Wait()
	for i := range n {
		require.NoError(t, errs[i], "store %d", i)
		t.Cleanup(func() { _ = stores[i].Close() })
	}
	var (
		isolation       string
		recorded, count int
	)
	require.NoError(t, stores[0].Pool().QueryRow(ctx, `SELECT count(*), count(DISTINCT version_id)
		FROM webhook_events_goose_version`).Scan(&recorded, &count))
	require.Equal(t, count, recorded, "each version recorded once")
	require.Greater(t, count, 6, "version 0 and every migration")
	require.NoError(t, stores[0].Pool().QueryRow(ctx, "SHOW default_transaction_isolation").Scan(&isolation))
	require.Equal(t, "serializable", isolation)

	for round := range 5 {
		id := fmt.Sprintf("evt_%d", round)
		outcomes := make([]store.Outcome, 4*n)
		for i := range outcomes {
			wg.Go(func() {
				c, err := stores[i%n].Claim(ctx, store.ClaimParams{Scope: "s", EventID: id, Lease: time.Minute})
				require.NoError(t, err)
				outcomes[i] = c.Outcome
			})
		}
		wg.Wait()
		claimed := 0
		for _, o := range outcomes {
			if o == store.Claimed {
				claimed++
			}
		}
		require.Equal(t, 1, claimed, "round %d: one winner of %v", round, outcomes)
	}
	t.Logf("conflicts run again: %d serialization failures, %d deadlocks",
		r.count(store.RetrySerialization), r.count(store.RetryDeadlock))
}

// A relay that accepts connections but never answers them (a load balancer
// whose backend is gone) for a few seconds while deliveries keep coming:
// their claims fail (each within its own store timeout), and the pool's
// openings of new connections hang in the startup handshake. Once the
// relay passes connections on again, claims succeed within the connect
// timeout: an opening still hanging must not hold a slot of the pool
// (pgxpool's own bound is 2 minutes, which answered claims
// ErrConnectionLost for minutes after the store was back).
func TestClaimsRecoverAfterSilentAcceptingRelay(t *testing.T) {
	t.Parallel()
	link, dsn := via(t, testDSN(t))
	const connect = time.Second
	// Unbatched (as Idempotency-Key claims are): each claim acquires its
	// own connection, as the gateway's lookups, heartbeats and spool do
	// next to the batch writer.
	s := newStore(t, postgres.Options{DSN: dsn, ConnectTimeout: connect, MaxConns: 4,
		Batch: store.BatchOptions{Disabled: true}})
	ctx := t.Context()
	_, err := s.Claim(ctx, store.ClaimParams{Scope: "s", EventID: "warm", Lease: time.Minute})
	require.NoError(t, err)

	link.Silence()
	var wg sync.WaitGroup
	for i := range 12 { // 3x the pool: every slot taken by a silent opening
		wg.Go(func() {
			sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			_, err := s.Claim(sctx, store.ClaimParams{Scope: "s", EventID: fmt.Sprintf("out%d", i), Lease: time.Minute})
			require.Error(t, err, "no server answered claim %d", i)
		})
	}
	wg.Wait()
	link.Restore()

	t0 := time.Now()
	deadline := t0.Add(connect + 5*time.Second)
	var last error
	for i := 0; time.Now().Before(deadline); i++ {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		c, err := s.Claim(sctx, store.ClaimParams{Scope: "s", EventID: fmt.Sprintf("after%d", i), Lease: time.Minute})
		cancel()
		if err == nil {
			require.Equal(t, store.Claimed, c.Outcome)
			t.Logf("first claim after the relay answered again: %s", time.Since(t0).Round(time.Millisecond))
			return
		}
		last = err
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("no claim succeeded within %s of the relay answering again: %v", time.Since(t0).Round(time.Millisecond), last)
}
