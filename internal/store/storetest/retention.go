package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// exerciseRetention covers DeleteBefore: bounded, per scope, never a live
// claim.
func exerciseRetention(t *testing.T, newStore func(t *testing.T) store.Store) {
	t.Helper()

	t.Run("SweepKeepsBodyHashesPastRetention", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		ctx := t.Context()
		const retention, replayWindow = 30 * 24 * time.Hour, 400 * 24 * time.Hour
		for i := range 7 {
			for scope, id := range map[string]string{"s": fmt.Sprintf("evt_%d", i), "s#body": fmt.Sprintf("sha256:%02d", i)} {
				c := claimed(t, s, scope, id)
				require.NoError(t, s.Complete(ctx, scope, id, c.Token, 200))
			}
		}
		expiries := func(now time.Time) []store.Expiry {
			return []store.Expiry{
				{Scopes: []string{"s"}, Cutoff: now.Add(-retention)},
				{Scopes: []string{"s#body"}, Cutoff: now.Add(-replayWindow)},
			}
		}
		count := func(scope string) int {
			evs, err := s.List(ctx, store.ListQuery{Scope: scope, Limit: 100})
			require.NoError(t, err)
			return len(evs)
		}
		now := time.Now()
		for _, tc := range []struct {
			at               time.Time
			deleted, ev, bod int
		}{
			{at: now, deleted: 0, ev: 7, bod: 7},
			{at: now.Add(retention - time.Hour), deleted: 0, ev: 7, bod: 7},
			{at: now.Add(retention + time.Hour), deleted: 7, ev: 0, bod: 7},
			{at: now.Add(replayWindow - time.Hour), deleted: 0, ev: 0, bod: 7},
			{at: now.Add(replayWindow + time.Hour), deleted: 7, ev: 0, bod: 0},
		} {
			// Batches of 3: several statements per expiry.
			n, err := store.Sweep(ctx, s, expiries(tc.at), 3, 5*time.Second)
			require.NoError(t, err)
			require.Equal(t, tc.deleted, n, "at now+%s", tc.at.Sub(now))
			require.Equal(t, tc.ev, count("s"), "event rows at now+%s", tc.at.Sub(now))
			require.Equal(t, tc.bod, count("s#body"), "body-hash rows at now+%s", tc.at.Sub(now))
		}
		// No cap: one sweep deletes every expired row, in as many batches
		// as it takes (40 rows, batches of 3: 14 statements).
		for i := range 40 {
			c := claimed(t, s, "s", fmt.Sprintf("late_%d", i))
			require.NoError(t, s.Complete(ctx, "s", fmt.Sprintf("late_%d", i), c.Token, 200))
		}
		n, err := store.Sweep(ctx, s, expiries(now.Add(replayWindow+time.Hour)), 3, 5*time.Second)
		require.NoError(t, err)
		require.Equal(t, 40, n)
		require.Zero(t, count("s"), "nothing expired is left")
	})

	t.Run("DeleteBefore", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		ctx := t.Context()

		// 6 settled rows (completed, released, held) and 2 processing.
		for i := range 4 {
			id := fmt.Sprintf("done_%d", i)
			c := claimed(t, s, "s", id)
			if i%2 == 0 {
				require.NoError(t, s.Complete(ctx, "s", id, c.Token, 200))
			} else {
				require.NoError(t, s.Release(ctx, "s", id, c.Token))
			}
		}
		for i := range 2 {
			id := fmt.Sprintf("held_%d", i)
			_, err := s.Claim(ctx, store.ClaimParams{Scope: "s", EventID: id, Lease: shortLease})
			require.NoError(t, err)
		}
		for i := range 2 {
			claimed(t, s, "s", fmt.Sprintf("busy_%d", i))
		}
		for i := range 2 {
			h := waitClaim(t, s, store.ClaimParams{Scope: "s", EventID: fmt.Sprintf("held_%d", i), Lease: lease, HoldOnExpiry: true})
			require.Equal(t, store.Held, h.Outcome)
		}
		// An expired processing row is still processing: never deleted.
		_, err := s.Claim(ctx, store.ClaimParams{Scope: "s", EventID: "expired", Lease: time.Millisecond})
		require.NoError(t, err)
		// Rows of other scopes (another route, with its own retention) are
		// never deleted by this route's sweep.
		for _, scope := range []string{"other", "s2", "S"} {
			c := claimed(t, s, scope, "done_0")
			require.NoError(t, s.Complete(ctx, scope, "done_0", c.Token, 200))
		}
		scopes := []string{"s", "s#body"}
		c := claimed(t, s, "s#body", "sha256:00")
		require.NoError(t, s.Complete(ctx, "s#body", "sha256:00", c.Token, 200))

		n, err := s.DeleteBefore(ctx, scopes, time.Now().Add(-time.Hour), 100)
		require.NoError(t, err)
		require.Zero(t, n, "nothing is that old")

		n, err = s.DeleteBefore(ctx, scopes, time.Now().Add(time.Hour), 0)
		require.NoError(t, err)
		require.Zero(t, n)

		n, err = s.DeleteBefore(ctx, nil, time.Now().Add(time.Hour), 100)
		require.NoError(t, err)
		require.Zero(t, n, "no scopes, no deletion")

		n, err = s.DeleteBefore(ctx, scopes, time.Now().Add(time.Hour), 4)
		require.NoError(t, err)
		require.Equal(t, 4, n, "bounded by limit")

		n, err = s.DeleteBefore(ctx, scopes, time.Now().Add(time.Hour), 100)
		require.NoError(t, err)
		require.Equal(t, 3, n)

		n, err = s.DeleteBefore(ctx, scopes, time.Now().Add(time.Hour), 100)
		require.NoError(t, err)
		require.Zero(t, n)

		left, err := s.List(ctx, store.ListQuery{Scope: "s"})
		require.NoError(t, err)
		require.ElementsMatch(t, []string{"busy_0", "busy_1", "expired"}, eventIDs(left))
		for _, ev := range left {
			require.Equal(t, store.StateProcessing, ev.State)
		}
		_, err = s.Get(ctx, "s#body", "sha256:00")
		require.ErrorIs(t, err, store.ErrNotFound)
		for _, scope := range []string{"other", "s2", "S"} {
			ev, err := s.Get(ctx, scope, "done_0")
			require.NoError(t, err, "scope %s", scope)
			require.Equal(t, store.StateCompleted, ev.State)
		}

		// The other scope's own sweep deletes its rows.
		n, err = s.DeleteBefore(ctx, []string{"other"}, time.Now().Add(time.Hour), 100)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		_, err = s.Get(ctx, "other", "done_0")
		require.ErrorIs(t, err, store.ErrNotFound)
	})
}
