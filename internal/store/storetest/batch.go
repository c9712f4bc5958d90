package storetest

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// exerciseConcurrent covers claims and settles of many concurrent
// deliveries, repeats of one event ID among them: what a store's batching
// (group commit) must leave exactly as one statement per operation would.
func exerciseConcurrent(t *testing.T, newStore func(t *testing.T) store.Store) {
	t.Helper()

	t.Run("ConcurrentDuplicatesOneClaimEach", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		const (
			workers = 16 // goroutines per event ID
			events  = 40
		)
		type result struct {
			id string
			c  store.Claim
		}
		var (
			wg      sync.WaitGroup
			results = make(chan result, workers*events)
			start   = make(chan struct{})
		)
		for w := range workers {
			wg.Go(func() {
				<-start
				for e := range events {
					// Each worker walks the IDs from its own offset, so repeats
					// of an ID arrive together and apart.
					id := fmt.Sprintf("evt_c%d", (e+w)%events)
					c, err := s.Claim(t.Context(), store.ClaimParams{Scope: "stripe", EventID: id, Lease: lease})
					if err != nil {
						t.Errorf("claim %s: %v", id, err)
						return
					}
					results <- result{id, c}
				}
			})
		}
		close(start)
		wg.Wait()
		close(results)

		winners := map[string]store.Claim{}
		n := 0
		for r := range results {
			n++
			switch r.c.Outcome {
			case store.Claimed:
				_, dup := winners[r.id]
				require.False(t, dup, "%s claimed twice", r.id)
				require.NotEmpty(t, r.c.Token)
				require.Equal(t, 1, r.c.Attempts)
				winners[r.id] = r.c
			case store.InFlight:
				require.Equal(t, 1, r.c.Attempts, "%s", r.id)
				require.GreaterOrEqual(t, r.c.RetryAfter.Seconds(), 1.0)
				require.LessOrEqual(t, r.c.RetryAfter, lease)
				require.Empty(t, r.c.Token)
			default:
				t.Fatalf("%s: outcome %s, want claimed or in_flight", r.id, r.c.Outcome)
			}
		}
		require.Equal(t, workers*events, n)
		require.Len(t, winners, events, "every event ID claimed exactly once")

		// Settle them all at once: a third each completed, released and
		// held (batched together when the store batches).
		kind := func(id string) int {
			var n int
			_, err := fmt.Sscanf(id, "evt_c%d", &n)
			require.NoError(t, err)
			return n % 3
		}
		const completed, released, held = 0, 1, 2
		var settle sync.WaitGroup
		for id, c := range winners {
			settle.Go(func() {
				var err error
				switch kind(id) {
				case completed:
					err = s.Complete(t.Context(), "stripe", id, c.Token, 200)
				case released:
					err = s.Release(t.Context(), "stripe", id, c.Token)
				default:
					err = s.Hold(t.Context(), "stripe", id, c.Token, "held by the test: "+id)
				}
				if err != nil {
					t.Errorf("settling %s: %v", id, err)
				}
			})
		}
		settle.Wait()
		for id, c := range winners {
			require.ErrorIs(t, s.Complete(t.Context(), "stripe", id, c.Token, 200), store.ErrLeaseLost, id)
			e, err := s.Get(t.Context(), "stripe", id)
			require.NoError(t, err)
			want := map[int]store.State{completed: store.StateCompleted, released: store.StateReleased, held: store.StateHeld}[kind(id)]
			require.Equal(t, want, e.State, id)
			if want == store.StateHeld {
				require.Equal(t, "held by the test: "+id, e.HoldReason, id)
			} else {
				require.Empty(t, e.HoldReason, id)
			}
		}

		// Again all together: completed IDs are duplicates, released ones
		// are claimed once more (attempt 2), exactly once.
		var (
			again   sync.WaitGroup
			mu      sync.Mutex
			claimed = map[string]int{}
		)
		for range 4 {
			for id := range winners {
				again.Go(func() {
					c, err := s.Claim(t.Context(), store.ClaimParams{Scope: "stripe", EventID: id, Lease: lease})
					if err != nil {
						t.Errorf("claim %s: %v", id, err)
						return
					}
					mu.Lock()
					defer mu.Unlock()
					k := kind(id)
					switch {
					case k == completed && c.Outcome == store.Duplicate && c.Status == 200:
					case k == held && c.Outcome == store.Held:
					case k == released && c.Outcome == store.Claimed && c.Attempts == 2:
						claimed[id]++
					case k == released && c.Outcome == store.InFlight && c.Attempts == 2:
					// Read while the winner's takeover is not yet committed: the
					// row, still released at attempt 1, is locked by it and
					// answers in flight for a second (see StmtInspect).
					case k == released && c.Outcome == store.InFlight && c.Attempts == 1 && c.RetryAfter == time.Second:
					default:
						t.Errorf("%s (kind %d): %+v", id, k, c)
					}
				})
			}
		}
		again.Wait()
		for id := range winners {
			if kind(id) == released {
				require.Equal(t, 1, claimed[id], "%s claimed again exactly once", id)
			}
		}
	})
}
