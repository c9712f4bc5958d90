// Package storetest is the conformance suite every store.Store
// implementation runs (River's riverdrivertest.Exercise): the postgres and
// sqlite packages call Run from their tests.
package storetest

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

const (
	// lease is long enough never to expire during a test.
	lease = 30 * time.Second
	// shortLease is waited out by the expiry tests: the clock that judges
	// expiry is the database's, so it cannot be faked from Go.
	shortLease = 300 * time.Millisecond
	// expiryWait bounds how long a test waits for a short lease to expire.
	expiryWait = 1500 * time.Millisecond
)

// Run exercises a store.Store. newStore must return an empty store of its
// own (a fresh table or file) and arrange its cleanup with t.Cleanup; it is
// called once per subtest, and subtests run in parallel.
func Run(t *testing.T, newStore func(t *testing.T) store.Store) {
	t.Helper()

	claim := func(t *testing.T, s store.Store, scope, id string) store.Claim {
		t.Helper()
		c, err := s.Claim(t.Context(), store.ClaimParams{Scope: scope, EventID: id, Lease: lease})
		require.NoError(t, err)
		return c
	}
	claimed := func(t *testing.T, s store.Store, scope, id string) store.Claim {
		t.Helper()
		c := claim(t, s, scope, id)
		require.Equal(t, store.Claimed, c.Outcome)
		return c
	}
	// waitClaim repeats a claim until an earlier short lease has expired by
	// the database clock. InFlight answers change nothing, so polling is
	// harmless.
	waitClaim := func(t *testing.T, s store.Store, p store.ClaimParams) store.Claim {
		t.Helper()
		deadline := time.Now().Add(expiryWait)
		for {
			c, err := s.Claim(t.Context(), p)
			require.NoError(t, err)
			if c.Outcome != store.InFlight {
				return c
			}
			require.True(t, time.Now().Before(deadline), "lease of %s did not expire within %s", shortLease, expiryWait)
			time.Sleep(50 * time.Millisecond)
		}
	}

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

	t.Run("GetForget", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)

		_, err := s.Get(t.Context(), "stripe", "missing")
		require.ErrorIs(t, err, store.ErrNotFound)
		require.ErrorIs(t, s.Forget(t.Context(), "stripe", "missing"), store.ErrNotFound)

		c := claimed(t, s, "stripe", "evt_1")
		require.NoError(t, s.Complete(t.Context(), "stripe", "evt_1", c.Token, 200))
		require.NoError(t, s.Forget(t.Context(), "stripe", "evt_1"))
		_, err = s.Get(t.Context(), "stripe", "evt_1")
		require.ErrorIs(t, err, store.ErrNotFound)
		require.ErrorIs(t, s.Forget(t.Context(), "stripe", "evt_1"), store.ErrNotFound)

		// Forgotten: the next delivery is a first one again.
		c2 := claimed(t, s, "stripe", "evt_1")
		require.Equal(t, 1, c2.Attempts)

		// Forgetting a processing row is allowed (operator action); its
		// holder then loses the lease.
		require.NoError(t, s.Forget(t.Context(), "stripe", "evt_1"))
		require.ErrorIs(t, s.Complete(t.Context(), "stripe", "evt_1", c2.Token, 200), store.ErrLeaseLost)
	})

	t.Run("List", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		ctx := t.Context()
		start := time.Now()

		want := map[store.State][]string{}
		for i := range 7 {
			id := fmt.Sprintf("evt_%02d", i)
			c := claimed(t, s, "stripe", id)
			switch i % 3 {
			case 0:
				require.NoError(t, s.Complete(ctx, "stripe", id, c.Token, 200))
				want[store.StateCompleted] = append(want[store.StateCompleted], id)
			case 1:
				require.NoError(t, s.Release(ctx, "stripe", id, c.Token))
				want[store.StateReleased] = append(want[store.StateReleased], id)
			default:
				want[store.StateProcessing] = append(want[store.StateProcessing], id)
			}
		}
		c := claimed(t, s, "github", "evt_00")
		require.NoError(t, s.Complete(ctx, "github", "evt_00", c.Token, 200))

		all, err := s.List(ctx, store.ListQuery{})
		require.NoError(t, err)
		require.Len(t, all, 8)
		requireOrdered(t, all)

		for state, ids := range want {
			got, err := s.List(ctx, store.ListQuery{State: state, Scope: "stripe"})
			require.NoError(t, err)
			require.ElementsMatch(t, ids, eventIDs(got), "state %s", state)
			for _, ev := range got {
				require.Equal(t, state, ev.State)
			}
		}
		completed, err := s.List(ctx, store.ListQuery{State: store.StateCompleted})
		require.NoError(t, err)
		require.Len(t, completed, len(want[store.StateCompleted])+1)
		held, err := s.List(ctx, store.ListQuery{State: store.StateHeld})
		require.NoError(t, err)
		require.Empty(t, held)

		// Paging with the (scope, event ID) cursor walks the same order.
		var paged []store.Event
		q := store.ListQuery{Limit: 3}
		for range 10 {
			page, err := s.List(ctx, q)
			require.NoError(t, err)
			require.LessOrEqual(t, len(page), 3)
			paged = append(paged, page...)
			if len(page) < 3 {
				break
			}
			q = after(q, page[len(page)-1])
		}
		require.Equal(t, keys(all), keys(paged))

		// Paging within a state and scope.
		page1, err := s.List(ctx, store.ListQuery{State: store.StateCompleted, Scope: "stripe", Limit: 2})
		require.NoError(t, err)
		require.Len(t, page1, 2)
		page2, err := s.List(ctx, after(store.ListQuery{State: store.StateCompleted, Scope: "stripe", Limit: 2}, page1[1]))
		require.NoError(t, err)
		require.ElementsMatch(t, want[store.StateCompleted], append(eventIDs(page1), eventIDs(page2)...))

		// OlderThan compares UpdatedAt.
		none, err := s.List(ctx, store.ListQuery{OlderThan: start.Add(-time.Hour)})
		require.NoError(t, err)
		require.Empty(t, none)
		older, err := s.List(ctx, store.ListQuery{OlderThan: time.Now().Add(time.Hour)})
		require.NoError(t, err)
		require.Len(t, older, 8)
		cut := all[3].UpdatedAt
		before, err := s.List(ctx, store.ListQuery{OlderThan: cut})
		require.NoError(t, err)
		for _, ev := range before {
			require.True(t, ev.UpdatedAt.Before(cut))
		}
		require.Less(t, len(before), 8)

		// The cursor is compared, never looked up: paging goes on when the
		// event it came from is gone or has changed since.
		first, err := s.List(ctx, store.ListQuery{Limit: 2})
		require.NoError(t, err)
		require.Len(t, first, 2)
		cursor := first[1]
		require.NoError(t, s.Forget(ctx, cursor.Scope, cursor.EventID))
		rest, err := s.List(ctx, after(store.ListQuery{}, cursor))
		require.NoError(t, err)
		require.Equal(t, keys(all[2:]), keys(rest))

		// A cursor without its UpdatedAt is refused, not taken as "from
		// the start".
		_, err = s.List(ctx, store.ListQuery{AfterScope: "stripe", AfterID: "evt_00"})
		require.Error(t, err)
	})

	t.Run("ListPagingStable", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		ctx := t.Context()

		// Rows claimed back to back share UpdatedAt values (SQLite keeps
		// milliseconds), so the scope and ID tie-breakers decide the order.
		tokens := map[string]string{}
		for i := range 40 {
			scope, id := fmt.Sprintf("s%d", i%3), fmt.Sprintf("e%03d", 39-i)
			tokens[scope+"\x00"+id] = claimed(t, s, scope, id).Token
		}
		all, err := s.List(ctx, store.ListQuery{})
		require.NoError(t, err)
		require.Len(t, all, 40)
		requireOrdered(t, all)

		var paged []store.Event
		q := store.ListQuery{Limit: 7}
		for i := range 20 {
			page, err := s.List(ctx, q)
			require.NoError(t, err)
			paged = append(paged, page...)
			if len(page) < q.Limit {
				break
			}
			q = after(q, page[len(page)-1])
			if i == 0 {
				// The event the cursor came from changes meanwhile (a
				// heartbeat moves its UpdatedAt to the end of the order):
				// paging goes on from where it was, and lists it again at
				// its new place.
				cur := page[len(page)-1]
				time.Sleep(5 * time.Millisecond) // past every UpdatedAt so far, at SQLite's resolution
				require.NoError(t, s.Heartbeat(ctx, cur.Scope, cur.EventID, tokens[cur.Scope+"\x00"+cur.EventID], lease))
			}
		}
		moved := all[6]
		require.Equal(t, append(keys(all), moved.Scope+"\x00"+moved.EventID), keys(paged))
	})

	t.Run("ListLimit", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		for i := range 105 {
			claimed(t, s, "s", fmt.Sprintf("e%03d", i))
		}
		def, err := s.List(t.Context(), store.ListQuery{})
		require.NoError(t, err)
		require.Len(t, def, 100, "default limit")
		big, err := s.List(t.Context(), store.ListQuery{Limit: 5000})
		require.NoError(t, err)
		require.Len(t, big, 105)
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

	// A route's body-hash rows (dedupe_body, scope "<scope>#body") outlive
	// its event rows: kept past retention, deleted after replay_window, so
	// a delivery replayed after retention is still a duplicate.
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
			n, err := store.Sweep(ctx, s, expiries(tc.at), 3, 100, 5*time.Second)
			require.NoError(t, err)
			require.Equal(t, tc.deleted, n, "at now+%s", tc.at.Sub(now))
			require.Equal(t, tc.ev, count("s"), "event rows at now+%s", tc.at.Sub(now))
			require.Equal(t, tc.bod, count("s#body"), "body-hash rows at now+%s", tc.at.Sub(now))
		}
		// maxBatches bounds one sweep.
		for i := range 7 {
			c := claimed(t, s, "s", fmt.Sprintf("late_%d", i))
			require.NoError(t, s.Complete(ctx, "s", fmt.Sprintf("late_%d", i), c.Token, 200))
		}
		n, err := store.Sweep(ctx, s, expiries(now.Add(replayWindow+time.Hour)), 3, 2, 5*time.Second)
		require.NoError(t, err)
		require.Equal(t, 6, n)
	})

	t.Run("Resolve", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		ctx := t.Context()
		get := func(t *testing.T, id string) store.Event {
			t.Helper()
			ev, err := s.Get(ctx, "s", id)
			require.NoError(t, err)
			return ev
		}
		// hold parks an event as held: its claim expires and the next
		// claim (on_ambiguous hold) holds it.
		hold := func(t *testing.T, id string) {
			t.Helper()
			_, err := s.Claim(ctx, store.ClaimParams{Scope: "s", EventID: id, Lease: shortLease})
			require.NoError(t, err)
			h := waitClaim(t, s, store.ClaimParams{Scope: "s", EventID: id, Lease: lease, HoldOnExpiry: true})
			require.Equal(t, store.Held, h.Outcome)
		}
		// resolveExpired resolves a processing row once its short lease has
		// expired by the database clock; before that it is a live claim.
		resolveExpired := func(t *testing.T, id string, to store.State) {
			t.Helper()
			deadline := time.Now().Add(expiryWait)
			for {
				err := s.Resolve(ctx, "s", id, to)
				if !errors.Is(err, store.ErrConflict) {
					require.NoError(t, err)
					return
				}
				require.True(t, time.Now().Before(deadline), "lease of %s did not expire within %s", shortLease, expiryWait)
				time.Sleep(50 * time.Millisecond)
			}
		}

		require.ErrorIs(t, s.Resolve(ctx, "s", "missing", store.StateReleased), store.ErrNotFound)

		t.Run("held to released", func(t *testing.T) {
			hold(t, "held_r")
			require.NoError(t, s.Resolve(ctx, "s", "held_r", store.StateReleased))
			ev := get(t, "held_r")
			require.Equal(t, store.StateReleased, ev.State)
			require.True(t, ev.LeaseUntil.IsZero())
			require.True(t, ev.CompletedAt.IsZero())
			// The next delivery is forwarded again.
			c := claimed(t, s, "s", "held_r")
			require.Equal(t, 2, c.Attempts)
		})

		t.Run("held to completed", func(t *testing.T) {
			hold(t, "held_c")
			before := get(t, "held_c")
			require.NoError(t, s.Resolve(ctx, "s", "held_c", store.StateCompleted))
			ev := get(t, "held_c")
			require.Equal(t, store.StateCompleted, ev.State)
			require.False(t, ev.CompletedAt.IsZero())
			require.Zero(t, ev.Status, "no upstream answer was seen")
			require.Equal(t, before.Attempts, ev.Attempts)
			require.False(t, ev.UpdatedAt.Before(before.UpdatedAt))
			d := claim(t, s, "s", "held_c")
			require.Equal(t, store.Duplicate, d.Outcome)
			// Again: already completed, nothing changes.
			require.NoError(t, s.Resolve(ctx, "s", "held_c", store.StateCompleted))
			require.Equal(t, ev, get(t, "held_c"))
		})

		t.Run("expired claim", func(t *testing.T) {
			for _, to := range []store.State{store.StateReleased, store.StateCompleted} {
				id := "expired_" + string(to)
				c, err := s.Claim(ctx, store.ClaimParams{Scope: "s", EventID: id, Lease: shortLease})
				require.NoError(t, err)
				require.Equal(t, store.Claimed, c.Outcome)
				resolveExpired(t, id, to)
				require.Equal(t, to, get(t, id).State)
				// The gateway that held the claim cannot settle it any more.
				require.ErrorIs(t, s.Complete(ctx, "s", id, c.Token, 200), store.ErrLeaseLost)
				require.ErrorIs(t, s.Release(ctx, "s", id, c.Token), store.ErrLeaseLost)
				require.Equal(t, to, get(t, id).State)
			}
		})

		t.Run("refused", func(t *testing.T) {
			live := claimed(t, s, "s", "live")
			done := claimed(t, s, "s", "done")
			require.NoError(t, s.Complete(ctx, "s", "done", done.Token, 201))
			gone := claimed(t, s, "s", "gone")
			require.NoError(t, s.Release(ctx, "s", "gone", gone.Token))

			cases := []struct {
				id   string
				to   store.State
				want error // nil: accepted, row unchanged
			}{
				{"live", store.StateReleased, store.ErrConflict},
				{"live", store.StateCompleted, store.ErrConflict},
				{"done", store.StateReleased, store.ErrConflict},
				{"done", store.StateCompleted, nil},
				{"gone", store.StateCompleted, store.ErrConflict},
				{"gone", store.StateReleased, nil},
			}
			for _, tc := range cases {
				before := get(t, tc.id)
				err := s.Resolve(ctx, "s", tc.id, tc.to)
				if tc.want == nil {
					require.NoError(t, err, "%s to %s", tc.id, tc.to)
				} else {
					require.ErrorIs(t, err, tc.want, "%s to %s", tc.id, tc.to)
				}
				require.Equal(t, before, get(t, tc.id), "%s to %s changed the row", tc.id, tc.to)
			}
			// Other target states are refused without touching the row.
			hold(t, "held_x")
			for _, to := range []store.State{store.StateProcessing, store.StateHeld, ""} {
				err := s.Resolve(ctx, "s", "held_x", to)
				require.Error(t, err)
				require.NotErrorIs(t, err, store.ErrConflict)
				require.Equal(t, store.StateHeld, get(t, "held_x").State)
			}
			// The live claim still settles normally.
			require.NoError(t, s.Complete(ctx, "s", "live", live.Token, 200))
			require.Equal(t, 201, get(t, "done").Status)
		})
	})

	t.Run("ScopesIsolated", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		ctx := t.Context()

		a := claimed(t, s, "stripe", "evt_1")
		b := claimed(t, s, "github", "evt_1")
		require.Equal(t, 1, b.Attempts)

		require.ErrorIs(t, s.Complete(ctx, "github", "evt_1", a.Token, 200), store.ErrLeaseLost)
		require.NoError(t, s.Complete(ctx, "stripe", "evt_1", a.Token, 200))
		require.Equal(t, store.Duplicate, claim(t, s, "stripe", "evt_1").Outcome)
		require.Equal(t, store.InFlight, claim(t, s, "github", "evt_1").Outcome)

		require.NoError(t, s.Release(ctx, "github", "evt_1", b.Token))
		require.Equal(t, store.Duplicate, claim(t, s, "stripe", "evt_1").Outcome)
		require.Equal(t, 2, claimed(t, s, "github", "evt_1").Attempts)

		require.NoError(t, s.Forget(ctx, "stripe", "evt_1"))
		gh, err := s.Get(ctx, "github", "evt_1")
		require.NoError(t, err)
		require.Equal(t, store.StateProcessing, gh.State)
		require.Equal(t, 2, gh.Attempts)

		list, err := s.List(ctx, store.ListQuery{Scope: "stripe"})
		require.NoError(t, err)
		require.Empty(t, list)
	})

	t.Run("UnusualIDs", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		ctx := t.Context()

		ids := []string{
			`it's "quoted" \ back\slash; DROP TABLE x; --`,
			"évènement-支払い-💳",
			"%_like_wildcards_%",
			" leading and trailing spaces ",
			"line\nbreak\ttab",
			maxID("é"),
			maxID("a"),
			maxID("💳"),
		}
		for _, id := range ids {
			require.LessOrEqual(t, len(id), 255)
			scope := "sc'ope\"ü"
			c := claimed(t, s, scope, id)
			require.NoError(t, s.Complete(ctx, scope, id, c.Token, 200))
			ev, err := s.Get(ctx, scope, id)
			require.NoError(t, err)
			require.Equal(t, id, ev.EventID)
			require.Equal(t, scope, ev.Scope)
			require.Equal(t, store.Duplicate, claim(t, s, scope, id).Outcome)
		}
		// No prefix or pattern matching: a near miss is another event.
		require.Equal(t, store.Claimed, claim(t, s, "sc'ope\"ü", "%").Outcome)
		require.Equal(t, store.Claimed, claim(t, s, "sc'ope\"ü", maxID("a")[:254]).Outcome)

		list, err := s.List(ctx, store.ListQuery{State: store.StateCompleted})
		require.NoError(t, err)
		require.ElementsMatch(t, ids, eventIDs(list))

		// Paging through them with the cursor.
		var paged []string
		q := store.ListQuery{State: store.StateCompleted, Limit: 1}
		for range len(ids) + 1 {
			page, err := s.List(ctx, q)
			require.NoError(t, err)
			if len(page) == 0 {
				break
			}
			paged = append(paged, page[0].EventID)
			q = after(q, page[0])
		}
		require.ElementsMatch(t, ids, paged)
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
		require.True(t, errors.Is(err, context.Canceled), "got %v", err)
	})
}

// maxID is the longest run of r that fits the 255-byte ID limit.
func maxID(r string) string {
	id := strings.Repeat(r, 255/len(r))
	if !utf8.ValidString(id) {
		panic("invalid UTF-8")
	}
	return id
}

func eventIDs(evs []store.Event) []string {
	ids := make([]string, len(evs))
	for i, ev := range evs {
		ids[i] = ev.EventID
	}
	return ids
}

// after sets q's paging cursor to ev, the last event of the previous page.
func after(q store.ListQuery, ev store.Event) store.ListQuery {
	q.AfterUpdatedAt, q.AfterScope, q.AfterID = ev.UpdatedAt, ev.Scope, ev.EventID
	return q
}

func keys(evs []store.Event) []string {
	ks := make([]string, len(evs))
	for i, ev := range evs {
		ks[i] = ev.Scope + "\x00" + ev.EventID
	}
	return ks
}

// requireOrdered checks List's order: UpdatedAt, then scope, then event ID.
func requireOrdered(t *testing.T, evs []store.Event) {
	t.Helper()
	require.True(t, slices.IsSortedFunc(evs, func(a, b store.Event) int {
		if c := a.UpdatedAt.Compare(b.UpdatedAt); c != 0 {
			return c
		}
		if c := strings.Compare(a.Scope, b.Scope); c != 0 {
			return c
		}
		return strings.Compare(a.EventID, b.EventID)
	}), "List is not ordered by UpdatedAt, scope, event ID")
}
