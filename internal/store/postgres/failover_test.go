package postgres_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/e2e"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store/postgres"
)

// tempCluster starts a temporary primary and standby (internal/e2e) for a
// failover test, or skips under -short or without PostgreSQL's server
// binaries.
func tempCluster(t *testing.T, repl e2e.Replication) *e2e.TempCluster {
	t.Helper()
	if testing.Short() {
		t.Skip("starts temporary PostgreSQL servers; skipped with -short")
	}
	if _, err := e2e.PGBinDir(); err != nil {
		t.Skip(err.Error())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := e2e.StartTempCluster(ctx, repl)
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return c
}

// claimConcurrently claims n new events at once (so the pool holds several
// connections) and returns how many failed, and their errors.
func claimConcurrently(s *postgres.Store, n int) (failed int, errs []error) {
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, err := s.Claim(ctx, store.ClaimParams{Scope: "s", EventID: "evt_" + store.NewToken()[:12], Lease: time.Minute})
			if err != nil {
				mu.Lock()
				failed, errs = failed+1, append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return failed, errs
}

// untilClaims retries claimConcurrently until a round succeeds, for at most
// limit, and returns how long that took.
func untilClaims(t *testing.T, s *postgres.Store, limit time.Duration) time.Duration {
	t.Helper()
	t0 := time.Now()
	for {
		failed, errs := claimConcurrently(s, 8)
		if failed == 0 {
			return time.Since(t0)
		}
		if time.Since(t0) > limit {
			t.Fatalf("claims still failing %s after the promotion: %v", limit, errs)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// The primary is stopped and its synchronous standby promoted: on a DSN
// that names both hosts (the standby first, which the implied
// target_session_attrs=read-write skips), claims fail as a store error while no primary exists, then
// succeed on the new primary without a new Store; the claim made on the
// old primary is there, and its settle lands on the new one.
func TestFailoverToPromotedStandby(t *testing.T) {
	c := tempCluster(t, e2e.Sync)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dsn := "postgres://postgres@" + c.Standby.Addr() + "," + c.Primary.Addr() + "/postgres?sslmode=disable"
	s, err := postgres.New(ctx, postgres.Options{DSN: dsn})
	require.NoError(t, err, "the store finds the primary behind the standby")
	defer s.Close()

	before, err := s.Claim(ctx, store.ClaimParams{Scope: "s", EventID: "evt_before", Lease: time.Minute})
	require.NoError(t, err)
	require.Equal(t, store.Claimed, before.Outcome)
	failed, errs := claimConcurrently(s, 8)
	require.Zero(t, failed, "claims on the primary: %v", errs)

	require.NoError(t, c.Primary.Stop(ctx, "fast"))
	failed, errs = claimConcurrently(s, 8)
	require.Equal(t, 8, failed, "no primary: every claim fails")
	for _, err := range errs {
		for _, sentinel := range []error{store.ErrNotFound, store.ErrLeaseLost} {
			require.NotErrorIs(t, err, sentinel, "a failover is a store error, not %v: %v", sentinel, err)
		}
	}

	require.NoError(t, c.Standby.Promote(ctx))
	took := untilClaims(t, s, 10*time.Second)
	t.Logf("claims succeed %s after the promotion", took.Round(time.Millisecond))
	for range 10 {
		failed, errs := claimConcurrently(s, 8)
		require.Zero(t, failed, "claims after the failover: %v", errs)
	}

	// Synchronous replication: the claim committed on the old primary is on
	// the new one, and settling it there works (a forward that completed
	// while the primary was gone).
	again, err := s.Claim(ctx, store.ClaimParams{Scope: "s", EventID: "evt_before", Lease: time.Minute})
	require.NoError(t, err)
	require.Equal(t, store.InFlight, again.Outcome, "the old primary's claim survived the failover")
	require.NoError(t, s.Complete(ctx, "s", "evt_before", before.Token, 200))
	ev, err := s.Get(ctx, "s", "evt_before")
	require.NoError(t, err)
	require.Equal(t, store.StateCompleted, ev.State)
}

// The old primary is fenced rather than stopped (made read-only, as an
// orchestrator does before promoting): the pool's connections to it answer
// 25006, which the store reports as a store error and which drops them, so
// once the standby is promoted every claim lands there. Without dropping
// them, the idle connections to the fenced primary would fail claims for as
// long as it stays up.
func TestFailoverFromFencedPrimary(t *testing.T) {
	c := tempCluster(t, e2e.Async)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := postgres.New(ctx, postgres.Options{DSN: c.DSN("postgres")})
	require.NoError(t, err)
	defer s.Close()
	failed, errs := claimConcurrently(s, 8)
	require.Zero(t, failed, "claims on the primary: %v", errs)
	// Claims are group-committed through one connection; open several so
	// the fence meets more than one.
	var conns []*pgxpool.Conn
	for range 4 {
		conn, err := s.Pool().Acquire(ctx)
		require.NoError(t, err)
		conns = append(conns, conn)
	}
	for _, conn := range conns {
		conn.Release()
	}
	require.GreaterOrEqual(t, s.Pool().Stat().IdleConns(), int32(4), "the pool holds several connections")

	require.NoError(t, c.Primary.Exec(ctx, "postgres", "ALTER SYSTEM SET default_transaction_read_only = on"))
	require.NoError(t, c.Primary.Exec(ctx, "postgres", "SELECT pg_reload_conf()"))
	time.Sleep(200 * time.Millisecond) // sessions apply the reload at their next statement
	failed, errs = claimConcurrently(s, 8)
	require.Positive(t, failed, "claims on the fenced primary fail")
	// The first meet 25006 on the pool's connections; once those are
	// dropped, new ones find no host that accepts writes.
	require.True(t, slices.ContainsFunc(errs, func(err error) bool { return strings.Contains(err.Error(), "SQLSTATE 25006") }),
		"a claim met 25006: %v", errs)

	require.NoError(t, c.Standby.Promote(ctx))
	took := untilClaims(t, s, 10*time.Second)
	t.Logf("claims succeed %s after the promotion", took.Round(time.Millisecond))
	for range 10 {
		failed, errs := claimConcurrently(s, 8)
		require.Zero(t, failed, "no connection left on the fenced primary: %v", errs)
	}
	var port int
	require.NoError(t, s.Pool().QueryRow(ctx, "SELECT inet_server_port()").Scan(&port))
	require.Equal(t, c.Standby.Port, port)
}
