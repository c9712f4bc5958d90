package e2e_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/e2e"
)

// A gateway whose pooled connections to PostgreSQL are black-holed by the
// network (a NAT or load balancer that dropped the flows: no reset, no
// answer; new flows work): 8 new deliveries right after (the connections
// used again at once, found by the statement deadline) or after 1.5s
// (found by the ping before use) are all forwarded, once each, and answered
// by the upstream; none is refused. In async mode the 8 are all queued
// (the enqueues' statement deadline) and delivered once each (an event
// taken by a take whose answer was lost waits for its lease to end).
func TestBlackHoledStoreConnections(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		idle  time.Duration
		async bool
	}{
		{"idle=0s", 0, false},
		{"idle=1.5s", 1500 * time.Millisecond, false},
		{"async,idle=0s", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, func(string, int) e2e.Answer { return e2e.Answer{} })
			link := b.storeLink()
			var extra []string
			if tc.async {
				// A take whose answer was lost leaves its events leased
				// to nobody until the lease ends: a short one.
				extra = []string{"mode async", "deliver_to http://" + b.up.Addr(), "lease 5s"}
			}
			g := b.start(e2e.GatewayConfig{Name: "gw", Upstream: b.up.Addr(),
				Handler: e2e.StripeHandler(b.secret, b.db.DSNVia(link.Addr()), extra...), Admin: true})
			deliverAll := func(ids []string) (map[string]int, time.Duration) {
				t0 := time.Now()
				byEvent := b.storm([]*e2e.Gateway{g}, ids, 1)
				took := time.Since(t0)
				if !tc.async {
					return b.requireOnceEach(ids, byEvent), took
				}
				counts := map[string]int{}
				for i, id := range ids {
					r := byEvent[i][0]
					require.True(t, r.Status == 200 && !r.Replayed, "event %s queued: %d %s", id, r.Status, r.Body)
					counts["queued"]++
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				for _, id := range ids {
					require.NoError(t, b.up.WaitFor(ctx, id, func(cs []e2e.Call) bool { return len(cs) >= 1 }), "event %s delivered", id)
				}
				return counts, took
			}
			warm := make([]string, 8)
			for i := range warm {
				warm[i] = e2e.NewEventID()
			}
			counts, _ := deliverAll(warm) // several connections open
			require.Equal(t, len(warm), counts["forwarded"]+counts["queued"])

			link.BlackHole()
			time.Sleep(tc.idle)
			ids := make([]string, 8)
			for i := range ids {
				ids[i] = e2e.NewEventID()
			}
			counts, took := deliverAll(ids)
			require.Equal(t, len(ids), counts["forwarded"]+counts["queued"], "0 of 8 refused: %s", sortedCounts(counts))
			for _, id := range ids {
				r := b.deliver(g, id)
				require.True(t, r.Status == 200 && r.Replayed, "event %s again: a duplicate (%d %s)", id, r.Status, r.Body)
			}
			time.Sleep(500 * time.Millisecond) // a second delivery of any event would show by now
			for _, id := range append(warm, ids...) {
				require.Len(t, b.up.Calls(id), 1, "event %s forwarded once", id)
			}
			lost, lerr := g.Metric(context.Background(), `caddy_webhook_idempotency_store_retries_total{reason="connection_lost"}`)
			if lerr != nil {
				lost = 0 // not exposed: nothing retried
			}
			t.Logf("8 deliveries after the store's flows were black-holed (%s): %s in %s; retried on another connection: %v",
				tc.name, sortedCounts(counts), took.Round(time.Millisecond), lost)
		})
	}
}

// On a database whose default isolation is SERIALIZABLE (as some platforms
// set it), a duplicate storm over three gateways: transactions PostgreSQL
// rolls back (40001, 40P01) run again, so no delivery is refused, each
// event reaches the upstream once, and the retries show in
// store_retries_total.
func TestSerializableDuplicateStorm(t *testing.T) {
	t.Parallel()
	b := setup(t, func(string, int) e2e.Answer { return e2e.Answer{Delay: 100 * time.Millisecond} })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, e2e.AdminDSN())
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{b.db.Name}.Sanitize()+" SET default_transaction_isolation = serializable")
	require.NoError(t, err)
	require.NoError(t, conn.Close(ctx))

	gws := make([]*e2e.Gateway, 3)
	for i := range gws {
		gws[i] = b.start(e2e.GatewayConfig{Name: "gw" + string(rune('a'+i)), Upstream: b.up.Addr(), Handler: e2e.StripeHandler(b.secret, b.db.DSN),
			Admin: true})
	}
	var isolation string
	check, err := pgx.Connect(ctx, b.db.DSN)
	require.NoError(t, err)
	require.NoError(t, check.QueryRow(ctx, "SHOW default_transaction_isolation").Scan(&isolation))
	require.NoError(t, check.Close(ctx))
	require.Equal(t, "serializable", isolation)

	ids := make([]string, 24)
	for i := range ids {
		ids[i] = e2e.NewEventID()
	}
	counts := b.requireOnceEach(ids, b.storm(gws, ids, 8))
	require.Equal(t, len(ids), counts["forwarded"], "one forward per event: %s", sortedCounts(counts))
	retried := map[string]float64{}
	for _, g := range gws {
		for _, reason := range []string{"serialization_failure", "deadlock"} {
			v, err := g.Metric(ctx, `caddy_webhook_idempotency_store_retries_total{reason="`+reason+`"}`)
			if err == nil {
				retried[reason] += v
			}
		}
	}
	t.Logf("duplicate storm under SERIALIZABLE: %d deliveries of %d events: %s; transactions run again: %v",
		len(ids)*8, len(ids), sortedCounts(counts), retried)
}
