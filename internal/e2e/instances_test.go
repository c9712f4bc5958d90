package e2e_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/e2e"
)

// Three gateways share one database; 200 deliveries of 20 events (10 each)
// go out at the same moment, spread over the three. The database's unique
// key decides every race: each event reaches the upstream once.
func TestThreeInstancesOnePostgres(t *testing.T) {
	t.Parallel()
	const (
		events    = 20
		perEvent  = 10
		instances = 3
	)
	// The upstream is slow enough that every event's deliveries overlap its
	// forward.
	b := setup(t, func(string, int) e2e.Answer { return e2e.Answer{Delay: 300 * time.Millisecond} })
	gws := make([]*e2e.Gateway, instances)
	for i := range gws {
		gws[i] = b.gateway("gw"+string(rune('a'+i)), "")
	}

	ids := make([]string, events)
	for i := range ids {
		ids[i] = e2e.NewEventID()
	}
	var (
		got   collector
		errs  collector
		wg    sync.WaitGroup
		start = make(chan struct{})
	)
	byEvent := make([][]e2e.Result, events)
	var mu sync.Mutex
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for n := range events * perEvent {
		ev, gw := n%events, gws[n%instances]
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			r, err := e2e.Deliver(ctx, b.client, gw.URL(), b.secret, ids[ev])
			if err != nil {
				errs.add(e2e.Result{Body: err.Error()})
				return
			}
			got.add(r)
			mu.Lock()
			byEvent[ev] = append(byEvent[ev], r)
			mu.Unlock()
		}()
	}
	close(start)
	wg.Wait()
	require.Empty(t, errs.all(), "transport errors")
	require.Len(t, got.all(), events*perEvent)

	for i, id := range ids {
		rs := byEvent[i]
		forwarded := 0
		for _, r := range rs {
			switch {
			case r.Forwarded():
				forwarded++
				require.Equal(t, 200, r.Status)
			case r.Status == 200 && r.Replayed:
				require.JSONEq(t, `{"received":true,"duplicate":true}`, r.Body)
			case r.Status == 409:
				require.GreaterOrEqual(t, r.RetryAfterSeconds(), 1, "409 carries Retry-After in seconds")
			default:
				t.Fatalf("event %s: unexpected answer %d (%s)", id, r.Status, summary(rs))
			}
		}
		require.Equal(t, 1, forwarded, "event %s: the provider saw the upstream's 200 once (%s)", id, summary(rs))
		require.Len(t, b.up.Calls(id), 1, "event %s: upstream calls", id)
		require.Equal(t, 1, b.up.Successes(id), "event %s: upstream successes", id)
	}

	// Every instance now answers every event as a duplicate, and the
	// upstream still saw each once. A redelivery may race the settle of the
	// forward that just answered (409 for a moment).
	for _, id := range ids {
		for _, g := range gws {
			rs := b.deliverUntil(g, id, 100*time.Millisecond, 30, func(r e2e.Result) bool { return r.Status != 409 })
			last := rs[len(rs)-1]
			require.True(t, last.Status == 200 && last.Replayed, "event %s via %s: %s", id, g.Name, summary(rs))
		}
		require.Equal(t, 1, b.up.Successes(id))
		row, ok := b.row(id)
		require.True(t, ok)
		require.Equal(t, "completed", row.State)
		require.Equal(t, 1, row.Attempts, "claimed once")
	}
	total := 0
	for _, calls := range b.up.Snapshot() {
		total += len(calls)
	}
	require.Equal(t, events, total, "upstream calls in all")
	byStatus := map[string]int{}
	for _, r := range got.all() {
		switch {
		case r.Forwarded():
			byStatus["200 forwarded"]++
		case r.Replayed:
			byStatus["200 replayed"]++
		default:
			byStatus[fmt.Sprint(r.Status)]++
		}
	}
	t.Logf("%d concurrent deliveries of %d events over %d instances: %s; upstream calls %d",
		events*perEvent, events, instances, sortedCounts(byStatus), total)
}
