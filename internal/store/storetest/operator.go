package storetest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// exerciseOperator covers the admin API's calls: Get, Forget, List and its
// paging, Resolve.
func exerciseOperator(t *testing.T, newStore func(t *testing.T) store.Store) {
	t.Helper()

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
			require.Equal(t, store.HoldLeaseExpired, get(t, "held_r").HoldReason)
			require.NoError(t, s.Resolve(ctx, "s", "held_r", store.StateReleased))
			ev := get(t, "held_r")
			require.Equal(t, store.StateReleased, ev.State)
			require.Empty(t, ev.HoldReason, "the reason goes with the hold")
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
}
