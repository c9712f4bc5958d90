package caddymodule

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/e2e"
)

// A PostgreSQL store unreachable at start (its link cut) does not fail the
// load: a route without a spool answers 503 store unavailable, forwarding
// nothing, and an async route's enqueue is answered 503; once the link is
// restored the store is opened (migrated) in the background and the same
// deliveries are forwarded and queued.
func TestStoreDownAtStartOpensLater(t *testing.T) {
	link, _ := cutStoreLink(t)

	t0 := time.Now()
	g := newGateway(t, "webhook_idempotency {\nprovider stripe\nsecret whsec_x\n}", onPostgres(), through(link.Addr()))
	require.Less(t, time.Since(t0), 10*time.Second, "the load does not wait for the store")
	p := g.h.backend.pending
	require.NotNil(t, p, "the store is opened in the background")
	require.False(t, p.Ready())
	async := newGateway(t, "webhook_idempotency {\nprovider stripe\nsecret whsec_x\nmode async\ndeliver_to http://127.0.0.1:9\n}",
		sharingStore(g))
	require.Same(t, g.h.backend, async.h.backend, "one store for both routes")

	deliver := func(gw *gateway, id string) answer {
		return gw.serve(withReplacer(stripeDelivery(t, "http://gateway.test/webhooks/stripe", "whsec_x", id, g.clock.Now())))
	}
	a := deliver(g, "evt_down_1")
	require.Equal(t, http.StatusServiceUnavailable, a.status, "%s", a.body)
	require.Contains(t, string(a.body), "event store unavailable")
	require.Zero(t, g.up.count(), "nothing forwarded without a claim")
	require.Len(t, g.logged("claiming event failed; answered 503, nothing forwarded"), 1)
	// A retry storm during the outage: each delivery answered and counted,
	// the warning throttled (a line each before: 21).
	for n := range 20 {
		a := deliver(g, fmt.Sprintf("evt_storm_%d", n))
		require.Equal(t, http.StatusServiceUnavailable, a.status, "%s", a.body)
	}
	require.Equal(t, 21.0, g.outcomes(outcomeStoreError))
	require.Len(t, g.deliveryLog(), 21, "each delivery keeps its own line")
	require.Less(t, len(g.logged("claiming event failed")), 5, "the warning is throttled")
	for n := range 10 {
		a = deliver(async, fmt.Sprintf("evt_down_async_%d", n))
		require.Equal(t, http.StatusServiceUnavailable, a.status, "%s", a.body)
	}
	require.Less(t, len(async.logged("enqueueing event failed")), 5, "the warning is throttled")
	a = deliver(async, "evt_down_2")
	require.Equal(t, http.StatusServiceUnavailable, a.status, "%s", a.body)
	_, err := g.h.backend.Get(context.Background(), g.h.Scope, "evt_down_1")
	require.ErrorIs(t, err, errStoreNotReady)
	require.Contains(t, err.Error(), "has not been reached and migrated since the gateway started")

	link.Restore()
	require.Eventually(t, p.Ready, 15*time.Second, 50*time.Millisecond, "opened once reachable")
	a = deliver(g, "evt_down_1")
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	require.Equal(t, 1, g.up.count())
	g.requireRow(g.h.Scope, "evt_down_1", "completed")
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := async.h.async.qb.q.Stats(ctx, async.h.Scope)
		return err == nil
	}, 15*time.Second, 50*time.Millisecond, "the queue is created once the store is open")
	a = deliver(async, "evt_down_2")
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
}

// cutStoreLink is a relay to the test PostgreSQL, cut (restore it with
// link.Restore), and the test DSN through it.
func cutStoreLink(t *testing.T) (*e2e.Link, *url.URL) {
	t.Helper()
	u, err := url.Parse(pgDSN(t))
	require.NoError(t, err)
	link, err := e2e.NewLink(u.Host)
	require.NoError(t, err)
	t.Cleanup(link.Close)
	link.Cut()
	u.Host = link.Addr()
	return link, u
}
