package storetest

import (
	"context"
	"encoding/hex"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// exerciseClaim covers Claim: a new claim, a refused one and why (InFlight with
// RetryAfter, Duplicate, Held), lease expiry, the race of concurrent claims,
// and bad input.
func exerciseClaim(t *testing.T, newStore func(t *testing.T) store.Store) {
	t.Helper()

	t.Run("ClaimNew", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)

		c := claimed(t, s, "stripe", "evt_1")
		require.Equal(t, 1, c.Attempts)
		require.Len(t, c.Token, 32)
		_, err := hex.DecodeString(c.Token)
		require.NoError(t, err)
		require.Zero(t, c.RetryAfter)
		require.Zero(t, c.Status)

		ev, err := s.Get(t.Context(), "stripe", "evt_1")
		require.NoError(t, err)
		require.Equal(t, "stripe", ev.Scope)
		require.Equal(t, "evt_1", ev.EventID)
		require.Equal(t, store.StateProcessing, ev.State)
		require.Equal(t, 1, ev.Attempts)
		require.False(t, ev.FirstSeen.IsZero())
		require.False(t, ev.UpdatedAt.Before(ev.FirstSeen))
		require.WithinDuration(t, ev.FirstSeen.Add(lease), ev.LeaseUntil, time.Second)
		require.True(t, ev.CompletedAt.IsZero())
		require.Zero(t, ev.Status)
		require.WithinDuration(t, time.Now(), ev.FirstSeen, time.Minute, "database and test clocks far apart")
	})

	t.Run("SecondClaimInFlight", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)

		first := claimed(t, s, "stripe", "evt_1")
		c := claim(t, s, "stripe", "evt_1")
		require.Equal(t, store.InFlight, c.Outcome)
		require.Empty(t, c.Token)
		require.Equal(t, 1, c.Attempts)
		require.GreaterOrEqual(t, c.RetryAfter, time.Second)
		require.LessOrEqual(t, c.RetryAfter, lease)
		require.Zero(t, c.RetryAfter%time.Second, "RetryAfter is whole seconds")

		// The first claim is untouched and can still settle.
		require.NoError(t, s.Complete(t.Context(), "stripe", "evt_1", first.Token, 200))
	})

	t.Run("RetryAfterAtLeastOneSecond", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)

		_, err := s.Claim(t.Context(), store.ClaimParams{Scope: "s", EventID: "e", Lease: 100 * time.Millisecond})
		require.NoError(t, err)
		c, err := s.Claim(t.Context(), store.ClaimParams{Scope: "s", EventID: "e", Lease: lease})
		require.NoError(t, err)
		if c.Outcome == store.InFlight { // the 100ms lease may already be gone
			require.Equal(t, time.Second, c.RetryAfter)
		}
	})

	t.Run("LeaseExpiryReclaims", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)

		p := store.ClaimParams{Scope: "stripe", EventID: "evt_1", Lease: shortLease}
		c1, err := s.Claim(t.Context(), p)
		require.NoError(t, err)
		require.Equal(t, store.Claimed, c1.Outcome)

		p.Lease = lease
		c2 := waitClaim(t, s, p)
		require.Equal(t, store.Claimed, c2.Outcome)
		require.Equal(t, 2, c2.Attempts)
		require.NotEqual(t, c1.Token, c2.Token)

		require.Equal(t, store.InFlight, claim(t, s, "stripe", "evt_1").Outcome)
	})

	t.Run("LeaseExpiryHolds", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)

		p := store.ClaimParams{Scope: "stripe", EventID: "evt_1", Lease: shortLease, HoldOnExpiry: true}
		c1, err := s.Claim(t.Context(), p)
		require.NoError(t, err)
		require.Equal(t, store.Claimed, c1.Outcome)

		// Live lease: in flight, not held.
		c, err := s.Claim(t.Context(), p)
		require.NoError(t, err)
		require.Equal(t, store.InFlight, c.Outcome)

		h := waitClaim(t, s, p)
		require.Equal(t, store.Held, h.Outcome)
		require.Equal(t, 1, h.Attempts)
		require.Empty(t, h.Token)

		ev, err := s.Get(t.Context(), "stripe", "evt_1")
		require.NoError(t, err)
		require.Equal(t, store.StateHeld, ev.State)
		require.True(t, ev.LeaseUntil.IsZero())
		require.Equal(t, store.HoldLeaseExpired, ev.HoldReason)

		// Held stays held, whatever the route's setting.
		for _, hold := range []bool{true, false} {
			c, err := s.Claim(t.Context(), store.ClaimParams{Scope: "stripe", EventID: "evt_1", Lease: lease, HoldOnExpiry: hold})
			require.NoError(t, err)
			require.Equal(t, store.Held, c.Outcome)
		}
		// The gateway that held the claim cannot settle it any more.
		require.ErrorIs(t, s.Complete(t.Context(), "stripe", "evt_1", c1.Token, 200), store.ErrLeaseLost)
		require.ErrorIs(t, s.Release(t.Context(), "stripe", "evt_1", c1.Token), store.ErrLeaseLost)
		require.ErrorIs(t, s.Heartbeat(t.Context(), "stripe", "evt_1", c1.Token, lease), store.ErrLeaseLost)

		// An operator forgets it: the next delivery is forwarded.
		require.NoError(t, s.Forget(t.Context(), "stripe", "evt_1"))
		require.Equal(t, store.Claimed, claim(t, s, "stripe", "evt_1").Outcome)
	})

	t.Run("ClaimRace", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)

		const n = 50
		var (
			wg       sync.WaitGroup
			start    = make(chan struct{})
			outcomes = make([]store.Claim, n)
			errs     = make([]error, n)
		)
		for i := range n {
			wg.Go(func() {
				<-start
				outcomes[i], errs[i] = s.Claim(t.Context(), store.ClaimParams{Scope: "stripe", EventID: "evt_race", Lease: lease})
			})
		}
		close(start)
		wg.Wait()

		var won int
		for i := range n {
			require.NoError(t, errs[i])
			switch outcomes[i].Outcome {
			case store.Claimed:
				won++
				require.Equal(t, 1, outcomes[i].Attempts)
			case store.InFlight:
				require.GreaterOrEqual(t, outcomes[i].RetryAfter, time.Second)
			default:
				t.Fatalf("goroutine %d: outcome %s", i, outcomes[i].Outcome)
			}
		}
		require.Equal(t, 1, won, "exactly one claim wins")

		ev, err := s.Get(t.Context(), "stripe", "evt_race")
		require.NoError(t, err)
		require.Equal(t, 1, ev.Attempts)
	})

	t.Run("InvalidLease", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)

		_, err := s.Claim(t.Context(), store.ClaimParams{Scope: "s", EventID: "e"})
		require.Error(t, err)
		_, err = s.Get(t.Context(), "s", "e")
		require.ErrorIs(t, err, store.ErrNotFound, "a refused claim records nothing")
	})

	t.Run("CanceledContext", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)

		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		_, err := s.Claim(ctx, store.ClaimParams{Scope: "s", EventID: "e", Lease: lease})
		require.Error(t, err)
		require.ErrorIs(t, err, context.Canceled)
	})
}
