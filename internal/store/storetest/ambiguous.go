package storetest

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// exerciseAmbiguous covers how a row counts the forwards that ended with
// no known outcome (Event.Ambiguous) and how a claim reports them
// (Claim.Ambiguous): ReleaseAmbiguous, Hold and an expired lease count;
// Release and Complete do not.
func exerciseAmbiguous(t *testing.T, newStore func(t *testing.T) store.Store) {
	t.Helper()

	t.Run("ReleaseAmbiguousCountsForTheNextClaim", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		c1 := claimed(t, s, "stripe", "evt_1")
		require.Zero(t, c1.Ambiguous)
		require.NoError(t, s.ReleaseAmbiguous(t.Context(), "stripe", "evt_1", c1.Token))
		require.ErrorIs(t, s.ReleaseAmbiguous(t.Context(), "stripe", "evt_1", c1.Token), store.ErrLeaseLost)
		ev, err := s.Get(t.Context(), "stripe", "evt_1")
		require.NoError(t, err)
		require.Equal(t, store.StateReleased, ev.State)
		require.Equal(t, 1, ev.Ambiguous)

		c2 := claimed(t, s, "stripe", "evt_1")
		require.Equal(t, 2, c2.Attempts)
		require.Equal(t, 1, c2.Ambiguous, "the claim knows the upstream may already have run the event")
		require.NoError(t, s.Release(t.Context(), "stripe", "evt_1", c2.Token))
		c3 := claimed(t, s, "stripe", "evt_1")
		require.Equal(t, 1, c3.Ambiguous, "a plain release counts nothing")
		require.NoError(t, s.Hold(t.Context(), "stripe", "evt_1", c3.Token, "reason"))
		ev, err = s.Get(t.Context(), "stripe", "evt_1")
		require.NoError(t, err)
		require.Equal(t, store.StateHeld, ev.State)
		require.Equal(t, 2, ev.Ambiguous, "a hold is an ambiguous ending")

		// An operator's release keeps the count: the next claim still knows.
		require.NoError(t, s.Resolve(t.Context(), "stripe", "evt_1", store.StateReleased))
		c4 := claimed(t, s, "stripe", "evt_1")
		require.Equal(t, 2, c4.Ambiguous)
		require.NoError(t, s.Complete(t.Context(), "stripe", "evt_1", c4.Token, 200))
		ev, err = s.Get(t.Context(), "stripe", "evt_1")
		require.NoError(t, err)
		require.Equal(t, 2, ev.Ambiguous, "a completed event keeps the count: it may have run more than once")
	})

	t.Run("ExpiredLeaseCountsAsAmbiguous", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		c1, err := s.Claim(t.Context(), store.ClaimParams{Scope: "stripe", EventID: "evt_1", Lease: shortLease})
		require.NoError(t, err)
		require.Equal(t, store.Claimed, c1.Outcome)
		c2 := waitClaim(t, s, store.ClaimParams{Scope: "stripe", EventID: "evt_1", Lease: lease})
		require.Equal(t, store.Claimed, c2.Outcome)
		require.Equal(t, 1, c2.Ambiguous, "taking over an expired lease: the dead forward may have run")

		// Under HoldOnExpiry the claim holds the row, and says it did.
		c3, err := s.Claim(t.Context(), store.ClaimParams{Scope: "stripe", EventID: "evt_2", Lease: shortLease, HoldOnExpiry: true})
		require.NoError(t, err)
		require.Equal(t, store.Claimed, c3.Outcome)
		held := waitClaim(t, s, store.ClaimParams{Scope: "stripe", EventID: "evt_2", Lease: lease, HoldOnExpiry: true})
		require.Equal(t, store.Held, held.Outcome)
		require.True(t, held.HeldNow)
		again := claim(t, s, "stripe", "evt_2")
		require.Equal(t, store.Held, again.Outcome)
		require.False(t, again.HeldNow, "only the claim that held it says so")
		ev, err := s.Get(t.Context(), "stripe", "evt_2")
		require.NoError(t, err)
		require.Equal(t, 1, ev.Ambiguous)
		require.Equal(t, store.HoldLeaseExpired, ev.HoldReason)
	})
}
