package postgres_test

import (
	"context"
	"net/url"
	"sync"
	"testing"
	"time"

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

// A claim whose statement committed but whose answer never came back (the
// relay drops the replies of the flows open then, as a NAT that forgot
// them) is tried once more, on a new connection, with the same token: the
// row it finds under that token is its own, so it is Claimed (attempts 1),
// its token settles it, and nobody else may claim the event.
func TestClaimRetryFindsItsOwnToken(t *testing.T) {
	t.Parallel()
	for _, batched := range []bool{true, false} {
		t.Run(map[bool]string{true: "batched", false: "unbatched"}[batched], func(t *testing.T) {
			t.Parallel()
			link, dsn := via(t, testDSN(t))
			var r retries
			s := newStore(t, postgres.Options{DSN: dsn, StatementTimeout: 500 * time.Millisecond,
				Retried: r.observe, Batch: store.BatchOptions{Disabled: !batched}})
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
