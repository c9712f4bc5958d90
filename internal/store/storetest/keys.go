package storetest

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// exerciseKeys covers what a key may be: scopes kept apart, and event IDs
// of every shape up to the 255-byte limit.
func exerciseKeys(t *testing.T, newStore func(t *testing.T) store.Store) {
	t.Helper()

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
}
