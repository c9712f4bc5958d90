// Package storetest is the conformance suite every store.Store
// implementation runs (River's riverdrivertest.Exercise): the postgres and
// sqlite packages call Run from their tests.
package storetest

import (
	"slices"
	"strings"
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
	exerciseClaim(t, newStore)
	exerciseSettle(t, newStore)
	exerciseOperator(t, newStore)
	exerciseRetention(t, newStore)
	exerciseKeys(t, newStore)
	exerciseResponse(t, newStore)
	exerciseConcurrent(t, newStore)
	exerciseAmbiguous(t, newStore)
}

// claim claims (scope, id) with the suite's lease.
func claim(t *testing.T, s store.Store, scope, id string) store.Claim {
	t.Helper()
	c, err := s.Claim(t.Context(), store.ClaimParams{Scope: scope, EventID: id, Lease: lease})
	require.NoError(t, err)
	return c
}

// claimed claims (scope, id) and requires the claim to be won.
func claimed(t *testing.T, s store.Store, scope, id string) store.Claim {
	t.Helper()
	c := claim(t, s, scope, id)
	require.Equal(t, store.Claimed, c.Outcome)
	return c
}

// waitClaim repeats a claim until an earlier short lease has expired by the
// database clock. InFlight answers change nothing, so polling is harmless.
func waitClaim(t *testing.T, s store.Store, p store.ClaimParams) store.Claim {
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
