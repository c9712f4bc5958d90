package e2e_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/e2e"
)

// Forward integrity (issue 10): every way a forward can end settles its
// claim once, balances claims_in_flight, logs an outcome, and an ambiguous
// end follows on_ambiguous. Each test runs real Caddy processes in front of
// a raw upstream socket, on the real PostgreSQL, and reads the rows, the
// gauge (the admin endpoint's /metrics) and the delivery log lines.

const inFlightSeries = `caddy_webhook_idempotency_claims_in_flight{scope="stripe"}`

// adminGateway starts a gateway with its admin endpoint on.
func (b *bundle) adminGateway(name, upstream string, extra ...string) *e2e.Gateway {
	b.t.Helper()
	return b.start(e2e.GatewayConfig{
		Name:     name,
		Upstream: upstream,
		Handler:  e2e.StripeHandler(b.secret, b.db.DSN, extra...),
		Admin:    true,
	})
}

// rawUpstream starts a raw upstream, closed in t.Cleanup.
func (b *bundle) rawUpstream(behave e2e.RawBehaviour) *e2e.RawUpstream {
	b.t.Helper()
	u, err := e2e.NewRawUpstream(behave)
	require.NoError(b.t, err)
	b.t.Cleanup(u.Close)
	return u
}

// requireGaugeZero waits (at most 10s) until the gateway's claims_in_flight
// gauge reads 0.
func requireGaugeZero(t *testing.T, g *e2e.Gateway) {
	t.Helper()
	var (
		v   float64
		err error
	)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		v, err = g.Metric(context.Background(), inFlightSeries)
		if err == nil && v == 0 {
			return
		}
	}
	t.Fatalf("claims_in_flight = %v (%v), want 0", v, err)
}

// deliveryLines waits (at most 10s) for n delivery lines of the event and
// returns their (outcome, status) pairs.
func deliveryLines(t *testing.T, g *e2e.Gateway, id string, n int) []string {
	t.Helper()
	var lines []map[string]any
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		var err error
		lines, err = g.DeliveryLines(id)
		require.NoError(t, err)
		if len(lines) >= n {
			break
		}
	}
	require.Len(t, lines, n, "delivery lines of %s", id)
	out := make([]string, 0, n)
	for _, l := range lines {
		out = append(out, fmt.Sprintf("%v/%v", l["outcome"], l["status"]))
	}
	return out
}

// deliverLoose posts one delivery and returns what came back, the
// transport error included (a cut answer is an error for the provider).
func (b *bundle) deliverLoose(c *http.Client, g *e2e.Gateway, id string) (e2e.Result, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return e2e.Deliver(ctx, c, g.URL(), b.secret, id)
}

// (a) The upstream sends 200 with Content-Length 10000, writes 100 bytes
// and closes. reverse_proxy aborts the answer (http.ErrAbortHandler); the
// upstream did the work, so the event is completed, under either policy.
func TestUpstreamBodyCutAfter200(t *testing.T) {
	t.Parallel()
	for _, policy := range []string{"reforward", "hold"} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			b := setup(t, nil)
			up := b.rawUpstream(func(string, int) e2e.RawAction {
				return e2e.RawAction{ContentLength: 10000, BodyBytes: 100}
			})
			g := b.adminGateway("a", up.Addr(), "on_ambiguous "+policy)
			id := e2e.NewEventID()

			r, err := b.deliverLoose(b.client, g, id)
			require.Error(t, err, "the provider's answer is cut too")
			require.Equal(t, 200, r.Status)
			row := b.waitState(id, "completed")
			require.Equal(t, 200, row.Status)
			require.Equal(t, 1, row.Attempts)
			require.Equal(t, 1, up.Calls(id))
			requireGaugeZero(t, g)
			require.Equal(t, []string{"completed/200"}, deliveryLines(t, g, id, 1))

			r = b.deliver(g, id)
			require.True(t, r.Status == 200 && r.Replayed, "the retry is a duplicate: %d %s", r.Status, r.Body)
			require.Equal(t, 1, up.Calls(id), "one execution")
			require.Positive(t, logCount(g, "aborting with incomplete response"), "reverse_proxy aborted the answer")
		})
	}
}

// The forward is detached from the provider's connection: the provider
// hangs up after 300ms, the upstream answers 200 after 1.5s with a body of
// 100 B to 4 MiB that the gateway cannot write anywhere. The event is
// completed, executed once, the gauge is back to 0, and the delivery line
// says completed.
func TestDetachedForwardLargeAnswers(t *testing.T) {
	t.Parallel()
	sizes := []int{100, 16 << 10, 256 << 10, 4 << 20}
	b := setup(t, nil)
	size := map[string]int{}
	ids := make([]string, len(sizes))
	for i, n := range sizes {
		ids[i] = e2e.NewEventID()
		size[ids[i]] = n
	}
	up := b.rawUpstream(func(id string, _ int) e2e.RawAction {
		return e2e.RawAction{Delay: 1500 * time.Millisecond, BodyBytes: size[id]}
	})
	g := b.adminGateway("a", up.Addr(), "on_ambiguous hold")
	impatient := e2e.NewClient(1, 300*time.Millisecond)
	defer impatient.CloseIdleConnections()

	for i, id := range ids {
		t.Run(strconv.Itoa(sizes[i]), func(t *testing.T) {
			_, err := b.deliverLoose(impatient, g, id)
			require.Error(t, err, "the provider hung up")
			row := b.waitState(id, "completed")
			require.Equal(t, 200, row.Status)
			require.Equal(t, 1, up.Calls(id))
			requireGaugeZero(t, g)
			require.Equal(t, []string{"completed/200"}, deliveryLines(t, g, id, 1))
			r := b.deliver(g, id)
			require.True(t, r.Status == 200 && r.Replayed, "the retry is a duplicate: %d", r.Status)
			require.Equal(t, 1, up.Calls(id), "one execution")
			t.Logf("answer of %d bytes: completed, 1 execution, answer written whole by the upstream: %d", sizes[i], up.Written(id))
		})
	}
}

// (b) The upstream reads the whole request, then closes the connection (or
// resets it) without a status line: ambiguous. reforward releases (the
// retry runs the upstream again); hold parks the event as held at once (the
// retry gets 503 and is not forwarded) until an operator completes it.
func TestUpstreamClosesWithoutAnswer(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"close", "reset"} {
		for _, policy := range []string{"reforward", "hold"} {
			t.Run(how+"/"+policy, func(t *testing.T) {
				t.Parallel()
				b := setup(t, nil)
				up := b.rawUpstream(func(_ string, n int) e2e.RawAction {
					if n == 1 {
						return e2e.RawAction{Close: how == "close", Reset: how == "reset"}
					}
					return e2e.RawAction{BodyBytes: 2}
				})
				g := b.adminGateway("a", up.Addr(), "on_ambiguous "+policy)
				id := e2e.NewEventID()

				r := b.deliver(g, id)
				require.Equal(t, 502, r.Status, "%s", r.Body)
				require.Equal(t, 1, up.Calls(id))
				requireGaugeZero(t, g)
				row, ok := b.row(id)
				require.True(t, ok)
				require.False(t, row.Live)

				if policy == "reforward" {
					require.Equal(t, "released", row.State)
					require.Equal(t, []string{"ambiguous_released/502"}, deliveryLines(t, g, id, 1), "never counted as a plain release")
					r = b.deliver(g, id)
					require.True(t, r.Forwarded(), "the retry is forwarded: %d %s", r.Status, r.Body)
					require.Equal(t, 2, up.Calls(id), "two executions")
					require.Equal(t, "completed", b.waitState(id, "completed").State)
					require.Equal(t, []string{"ambiguous_released/502", "completed/200"}, deliveryLines(t, g, id, 2))
					requireGaugeZero(t, g)
					return
				}
				require.Equal(t, "held", row.State, "held at once")
				require.Equal(t, []string{"ambiguous/502"}, deliveryLines(t, g, id, 1))
				r = b.deliver(g, id)
				require.Equal(t, 503, r.Status, "the retry is refused while held: %s", r.Body)
				require.Contains(t, r.Body, "held")
				require.Equal(t, 1, up.Calls(id), "not forwarded")

				status, body, err := g.AdminCall(context.Background(), http.MethodPost, "/webhook_idempotency/events/stripe/"+id+"/complete")
				require.NoError(t, err)
				require.Equal(t, 200, status, "an operator completes it at once: %s", body)
				r = b.deliver(g, id)
				require.True(t, r.Status == 200 && r.Replayed, "then a duplicate: %d %s", r.Status, r.Body)
				require.Equal(t, 1, up.Calls(id), "one execution")
				require.Equal(t, []string{"ambiguous/502", "held/0", "duplicate/0"}, deliveryLines(t, g, id, 3))
			})
		}
	}
}

// An upstream that reads every request and closes without answering, under
// on_ambiguous reforward (issue 21, item 7's 8-of-8 run): the first
// ambiguous ending releases the event, the re-forward is warned about, and
// the second holds it: 2 executions for 8 deliveries, the later ones 503
// without Retry-After.
func TestUpstreamAlwaysClosesBoundedReforward(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	up := b.rawUpstream(func(string, int) e2e.RawAction { return e2e.RawAction{Close: true} })
	g := b.adminGateway("a", up.Addr(), "on_ambiguous reforward")
	id := e2e.NewEventID()
	var statuses []int
	for range 8 {
		r := b.deliver(g, id)
		statuses = append(statuses, r.Status)
		if r.Status == 503 {
			require.Equal(t, -1, r.RetryAfterSeconds(), "held: no Retry-After")
			require.Contains(t, r.Body, "may still be running")
		}
	}
	require.Equal(t, []int{502, 502, 503, 503, 503, 503, 503, 503}, statuses)
	require.Equal(t, 2, up.Calls(id), "upstream executions for 8 deliveries")
	row := b.waitState(id, "held")
	require.Equal(t, 2, row.Ambiguous)
	require.Contains(t, row.HoldReason, "a second forward ended with no known outcome")
	require.Equal(t, []string{"ambiguous_released/502", "ambiguous/502", "held/0", "held/0", "held/0", "held/0", "held/0", "held/0"},
		deliveryLines(t, g, id, 8))
	require.Equal(t, 1, logCount(g, "forwarding an event again that an earlier forward may already have run"))
	requireGaugeZero(t, g)
}

// (c) A refused connection: the request never reached the upstream, so the
// claim is released under both policies and the retry is forwarded.
func TestUpstreamRefusedReleasesUnderBothPolicies(t *testing.T) {
	t.Parallel()
	for _, policy := range []string{"reforward", "hold"} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			b := setup(t, nil)
			port, err := e2e.FreePort()
			require.NoError(t, err)
			addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) // nothing listens yet
			g := b.adminGateway("a", addr, "on_ambiguous "+policy)
			id := e2e.NewEventID()

			r := b.deliver(g, id)
			require.Equal(t, 502, r.Status)
			row, ok := b.row(id)
			require.True(t, ok)
			require.Equal(t, "released", row.State)
			requireGaugeZero(t, g)
			require.Equal(t, []string{"released/502"}, deliveryLines(t, g, id, 1))

			up, err := e2e.ListenUpstream(addr, nil)
			require.NoError(t, err)
			t.Cleanup(up.Close)
			r = b.deliver(g, id)
			require.True(t, r.Forwarded(), "the retry is forwarded: %d %s", r.Status, r.Body)
			require.Len(t, up.Calls(id), 1, "one execution")
			require.Equal(t, "completed", b.waitState(id, "completed").State)
		})
	}
}

// A hold that fails on a store error is retried in the background like any
// settle: the store is cut off for the gateway (a relay, the server stays
// up) when its forward ends ambiguously under on_ambiguous hold; once the
// store is back the event is held, not left processing, and a second
// instance's delivery gets 503, not a forward.
func TestHoldRetriedAfterStoreCut(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	up := b.rawUpstream(func(string, int) e2e.RawAction { return e2e.RawAction{Delay: 500 * time.Millisecond, Close: true} })
	link := b.storeLink()
	ga := b.gatewayOn("a", up.Addr(), b.db.DSNVia(link.Addr()), "lease 2s", "on_ambiguous hold")
	gb := b.gateway("b", up.Addr(), "lease 2s", "on_ambiguous hold")
	id := e2e.NewEventID()

	first := b.deliverLater(ga, id)
	for deadline := time.Now().Add(10 * time.Second); up.Calls(id) == 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	require.Equal(t, 1, up.Calls(id))
	link.Cut()
	r := <-first
	require.Equal(t, 502, r.Status, "%s", r.Body)
	row, ok := b.row(id)
	require.True(t, ok)
	require.Equal(t, "processing", row.State, "gateway a could not hold while cut off")

	time.Sleep(time.Second)
	link.Restore()
	row = b.waitState(id, "held")
	require.Equal(t, 1, row.Attempts)
	require.Positive(t, logCount(ga, "settled event after a store error"), "the hold was retried")
	r = b.deliver(gb, id)
	require.Equal(t, 503, r.Status, "held: %s", r.Body)
	require.Equal(t, 1, up.Calls(id), "one execution")
}
