package e2e_test

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/e2e"
)

// Issue 20, item 6: providers that hang up while their claims wait on the
// store (a lock holds the events table longer than their timeout) are
// outcome provider_gone, not store_error, and no warning is logged: the
// store is healthy. The claims the store commits for them once the lock
// goes are given back, so their redeliveries are forwarded at once (not
// 409 for a lease), each event once.
func TestProviderHangingUpBeforeItsClaimIsNotAStoreError(t *testing.T) {
	t.Parallel()
	const n = 20
	b := setup(t, func(string, int) e2e.Answer { return e2e.Answer{} })
	g := b.gatewayWith(e2e.GatewayConfig{Name: "a", Admin: true}, b.db.DSN)
	require.True(t, b.deliver(g, e2e.NewEventID()).Forwarded(), "the events table exists")

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, b.db.DSN)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "LOCK TABLE webhook_events IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)

	impatient := e2e.NewClient(n, time.Second) // the provider's timeout
	defer impatient.CloseIdleConnections()
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range ids {
		ids[i] = e2e.NewEventID()
		wg.Go(func() {
			_, err := e2e.Deliver(ctx, impatient, g.URL(), b.secret, ids[i])
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				t.Errorf("delivery %s: want the client's timeout, got %v", ids[i], err)
			}
		})
	}
	wg.Wait()
	time.Sleep(1500 * time.Millisecond) // the claims still wait on the lock
	require.NoError(t, tx.Rollback(ctx))

	series := func(outcome string) string {
		return `caddy_webhook_idempotency_deliveries_total{outcome="` + outcome + `",provider="stripe",scope="stripe"}`
	}
	var gone, completed float64
	require.Eventually(t, func() bool {
		gone, _ = g.Metric(ctx, series("provider_gone"))
		completed, _ = g.Metric(ctx, series("completed"))
		return gone+completed == n+1 // +1: the first delivery
	}, 20*time.Second, 100*time.Millisecond, "every delivery counted")
	storeErrors, err := g.Metric(ctx, series("store_error"))
	require.NoError(t, err)
	require.Zero(t, storeErrors, "the store was healthy")
	require.GreaterOrEqual(t, gone, float64(n-1), "at most the delivery writing the batch went on to forward")
	log, err := os.ReadFile(g.LogPath())
	require.NoError(t, err)
	require.NotContains(t, string(log), "claiming event failed")
	for _, line := range strings.Split(string(log), "\n") {
		if !strings.Contains(line, `"level":"warn"`) {
			continue
		}
		for _, id := range ids {
			require.NotContains(t, line, id, "no warning for a provider that hung up")
		}
	}

	// Redeliveries: forwarded at once (a committed claim was given back),
	// each event once in all.
	for _, id := range ids {
		r := b.deliver(g, id)
		require.True(t, r.OK(), "redelivery of %s: %d %s", id, r.Status, r.Body)
	}
	for _, id := range ids {
		require.Equal(t, 1, b.up.Successes(id), "event %s", id)
	}
	t.Logf("%d providers hung up while their claims waited on a lock: provider_gone %v, completed %v (the batch writer's), store_error %v",
		n, gone, completed-1, storeErrors)
}
