package storetest

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// exerciseSettle covers what a claim's token does: Complete, Release and
// Heartbeat, a stale token refused, and the race of release and claim.
func exerciseSettle(t *testing.T, newStore func(t *testing.T) store.Store) {
	t.Helper()

	t.Run("CompleteThenDuplicate", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)

		c := claimed(t, s, "stripe", "evt_1")
		require.NoError(t, s.Complete(t.Context(), "stripe", "evt_1", c.Token, 201))

		for range 2 {
			d := claim(t, s, "stripe", "evt_1")
			require.Equal(t, store.Duplicate, d.Outcome)
			require.Equal(t, 201, d.Status)
			require.Equal(t, 1, d.Attempts)
			require.Empty(t, d.Token)
		}

		ev, err := s.Get(t.Context(), "stripe", "evt_1")
		require.NoError(t, err)
		require.Equal(t, store.StateCompleted, ev.State)
		require.Equal(t, 201, ev.Status)
		require.False(t, ev.CompletedAt.IsZero())
		require.True(t, ev.LeaseUntil.IsZero())

		// Settled once: the token no longer holds the row.
		require.ErrorIs(t, s.Complete(t.Context(), "stripe", "evt_1", c.Token, 200), store.ErrLeaseLost)
		require.ErrorIs(t, s.Release(t.Context(), "stripe", "evt_1", c.Token), store.ErrLeaseLost)
		require.ErrorIs(t, s.Heartbeat(t.Context(), "stripe", "evt_1", c.Token, lease), store.ErrLeaseLost)
		ev2, err := s.Get(t.Context(), "stripe", "evt_1")
		require.NoError(t, err)
		require.Equal(t, store.StateCompleted, ev2.State)
		require.Equal(t, 201, ev2.Status)
	})

	t.Run("ReleaseThenClaim", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)

		c1 := claimed(t, s, "stripe", "evt_1")
		require.NoError(t, s.Release(t.Context(), "stripe", "evt_1", c1.Token))

		ev, err := s.Get(t.Context(), "stripe", "evt_1")
		require.NoError(t, err)
		require.Equal(t, store.StateReleased, ev.State)
		require.True(t, ev.LeaseUntil.IsZero())

		c2 := claimed(t, s, "stripe", "evt_1")
		require.Equal(t, 2, c2.Attempts)
		require.NotEqual(t, c1.Token, c2.Token)

		ev, err = s.Get(t.Context(), "stripe", "evt_1")
		require.NoError(t, err)
		require.Equal(t, store.StateProcessing, ev.State)
		require.Equal(t, 2, ev.Attempts)

		// The released token cannot settle the new claim.
		require.ErrorIs(t, s.Complete(t.Context(), "stripe", "evt_1", c1.Token, 200), store.ErrLeaseLost)
		require.NoError(t, s.Complete(t.Context(), "stripe", "evt_1", c2.Token, 200))
	})

	t.Run("HoldAtOnce", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)

		// A live claim (long lease) is held at once by its own token, with
		// the reason the gateway gives.
		const why = "forward_timeout ended the forward before an upstream status arrived"
		c := claimed(t, s, "stripe", "evt_1")
		require.ErrorIs(t, s.Hold(t.Context(), "stripe", "evt_1", store.NewToken(), why), store.ErrLeaseLost)
		require.ErrorIs(t, s.Hold(t.Context(), "stripe", "nope", c.Token, why), store.ErrLeaseLost)
		ev, err := s.Get(t.Context(), "stripe", "evt_1")
		require.NoError(t, err)
		require.Empty(t, ev.HoldReason, "not held")
		require.NoError(t, s.Hold(t.Context(), "stripe", "evt_1", c.Token, why))

		ev, err = s.Get(t.Context(), "stripe", "evt_1")
		require.NoError(t, err)
		require.Equal(t, store.StateHeld, ev.State)
		require.Equal(t, why, ev.HoldReason)
		require.True(t, ev.LeaseUntil.IsZero())
		require.Equal(t, 1, ev.Attempts)
		evs, err := s.List(t.Context(), store.ListQuery{State: store.StateHeld, Scope: "stripe"})
		require.NoError(t, err)
		require.Len(t, evs, 1)
		require.Equal(t, why, evs[0].HoldReason, "listed with its reason")
		for _, hold := range []bool{true, false} {
			h, err := s.Claim(t.Context(), store.ClaimParams{Scope: "stripe", EventID: "evt_1", Lease: lease, HoldOnExpiry: hold})
			require.NoError(t, err)
			require.Equal(t, store.Held, h.Outcome)
		}
		// Held once: the token no longer holds the row.
		require.ErrorIs(t, s.Hold(t.Context(), "stripe", "evt_1", c.Token, why), store.ErrLeaseLost)
		require.ErrorIs(t, s.Complete(t.Context(), "stripe", "evt_1", c.Token, 200), store.ErrLeaseLost)
		require.ErrorIs(t, s.Release(t.Context(), "stripe", "evt_1", c.Token), store.ErrLeaseLost)

		// An operator resolves it at once: no lease to wait for. The
		// reason goes with the hold.
		require.NoError(t, s.Resolve(t.Context(), "stripe", "evt_1", store.StateCompleted))
		require.Equal(t, store.Duplicate, claim(t, s, "stripe", "evt_1").Outcome)
		ev, err = s.Get(t.Context(), "stripe", "evt_1")
		require.NoError(t, err)
		require.Empty(t, ev.HoldReason)

		// A completed or released row is never held.
		c2 := claimed(t, s, "stripe", "evt_2")
		require.NoError(t, s.Release(t.Context(), "stripe", "evt_2", c2.Token))
		require.ErrorIs(t, s.Hold(t.Context(), "stripe", "evt_2", c2.Token, why), store.ErrLeaseLost)
		ev, err = s.Get(t.Context(), "stripe", "evt_2")
		require.NoError(t, err)
		require.Equal(t, store.StateReleased, ev.State)
	})

	t.Run("StaleToken", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)

		old, err := s.Claim(t.Context(), store.ClaimParams{Scope: "stripe", EventID: "evt_1", Lease: shortLease})
		require.NoError(t, err)
		require.Equal(t, store.Claimed, old.Outcome)
		cur := waitClaim(t, s, store.ClaimParams{Scope: "stripe", EventID: "evt_1", Lease: lease})
		require.Equal(t, store.Claimed, cur.Outcome)

		before, err := s.Get(t.Context(), "stripe", "evt_1")
		require.NoError(t, err)

		require.ErrorIs(t, s.Heartbeat(t.Context(), "stripe", "evt_1", old.Token, time.Hour), store.ErrLeaseLost)
		require.ErrorIs(t, s.Complete(t.Context(), "stripe", "evt_1", old.Token, 200), store.ErrLeaseLost)
		require.ErrorIs(t, s.Release(t.Context(), "stripe", "evt_1", old.Token), store.ErrLeaseLost)

		after, err := s.Get(t.Context(), "stripe", "evt_1")
		require.NoError(t, err)
		require.Equal(t, before, after, "the new owner's row was changed")
		require.Equal(t, store.InFlight, claim(t, s, "stripe", "evt_1").Outcome)

		// Unknown tokens and unknown events are lost leases too.
		require.ErrorIs(t, s.Complete(t.Context(), "stripe", "evt_1", store.NewToken(), 200), store.ErrLeaseLost)
		require.ErrorIs(t, s.Complete(t.Context(), "stripe", "evt_1", "", 200), store.ErrLeaseLost)
		require.ErrorIs(t, s.Release(t.Context(), "stripe", "nope", cur.Token), store.ErrLeaseLost)
		require.ErrorIs(t, s.Heartbeat(t.Context(), "other", "evt_1", cur.Token, lease), store.ErrLeaseLost)

		require.NoError(t, s.Complete(t.Context(), "stripe", "evt_1", cur.Token, 200))
	})

	t.Run("HeartbeatExtendsLease", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)

		c, err := s.Claim(t.Context(), store.ClaimParams{Scope: "stripe", EventID: "evt_1", Lease: shortLease})
		require.NoError(t, err)
		require.Equal(t, store.Claimed, c.Outcome)
		before, err := s.Get(t.Context(), "stripe", "evt_1")
		require.NoError(t, err)

		require.NoError(t, s.Heartbeat(t.Context(), "stripe", "evt_1", c.Token, lease))
		ev, err := s.Get(t.Context(), "stripe", "evt_1")
		require.NoError(t, err)
		require.True(t, ev.LeaseUntil.After(before.LeaseUntil.Add(lease/2)), "lease not extended: %s -> %s", before.LeaseUntil, ev.LeaseUntil)
		require.Equal(t, 1, ev.Attempts)

		// Past the original lease, the claim is still live.
		time.Sleep(shortLease + 200*time.Millisecond)
		in := claim(t, s, "stripe", "evt_1")
		require.Equal(t, store.InFlight, in.Outcome)
		require.Greater(t, in.RetryAfter, lease/2)

		require.NoError(t, s.Complete(t.Context(), "stripe", "evt_1", c.Token, 204))
		require.ErrorIs(t, s.Heartbeat(t.Context(), "stripe", "evt_1", c.Token, lease), store.ErrLeaseLost)
	})

	t.Run("ReleaseRace", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)

		c := claimed(t, s, "stripe", "evt_race")
		require.NoError(t, s.Release(t.Context(), "stripe", "evt_race", c.Token))

		const n = 20
		var (
			wg    sync.WaitGroup
			mu    sync.Mutex
			won   int
			start = make(chan struct{})
		)
		for range n {
			wg.Go(func() {
				<-start
				c, err := s.Claim(t.Context(), store.ClaimParams{Scope: "stripe", EventID: "evt_race", Lease: lease})
				if err != nil || (c.Outcome != store.Claimed && c.Outcome != store.InFlight) {
					t.Errorf("claim: %v, %v", c.Outcome, err)
					return
				}
				if c.Outcome == store.Claimed {
					mu.Lock()
					won++
					mu.Unlock()
				}
			})
		}
		close(start)
		wg.Wait()
		require.Equal(t, 1, won, "exactly one claim takes over a released row")
	})
}
