package e2e_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/e2e"
)

// The store becomes unreachable for one gateway while it forwards (its
// connections to PostgreSQL cut through a relay, the server itself stays
// up): the upstream's 200 still reaches the provider, and once the store is
// back the gateway records the event as completed, even though its lease ran
// out meanwhile. The other instance then answers a redelivery as a
// duplicate instead of forwarding it again.
func TestStoreCutDuringForwardCompletesLater(t *testing.T) {
	t.Parallel()
	const lease = 2 * time.Second
	b := setup(t, func(string, int) e2e.Answer { return e2e.Answer{Delay: 1500 * time.Millisecond} })
	link := b.storeLink()
	ga := b.gatewayOn("a", "", b.db.DSNVia(link.Addr()), "lease 2s")
	gb := b.gateway("b", "", "lease 2s")
	id := e2e.NewEventID()

	first := b.deliverForwarded(ga, id)
	link.Cut()
	cutAt := time.Now()

	r := <-first
	require.True(t, r.Forwarded(), "the upstream's answer reaches the provider: %d %s", r.Status, r.Body)
	row, ok := b.row(id)
	require.True(t, ok)
	require.Equal(t, "processing", row.State, "gateway a could not settle while cut off")

	// Restore the store after the lease has run out.
	time.Sleep(time.Until(cutAt.Add(lease + time.Second)))
	link.Restore()
	row = b.waitState(id, "completed")
	require.Equal(t, 200, row.Status)
	require.Equal(t, 1, row.Attempts)

	r = b.deliver(gb, id)
	require.True(t, r.Status == 200 && r.Replayed, "redelivery via b is a duplicate: %d %s", r.Status, r.Body)
	r = b.deliver(ga, id)
	require.True(t, r.Status == 200 && r.Replayed, "redelivery via a is a duplicate: %d %s", r.Status, r.Body)
	require.Len(t, b.up.Calls(id), 1)
	require.Equal(t, 1, b.up.Successes(id))
}
