package e2e_test

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/e2e"
)

// The provider gives up after 1s while the upstream takes 3s: the forward
// runs on to the upstream's answer, the event is completed, and the
// provider's retry is answered at the edge.
func TestProviderDisconnectForwardCompletes(t *testing.T) {
	t.Parallel()
	b := setup(t, func(string, int) e2e.Answer { return e2e.Answer{Delay: 3 * time.Second} })
	g := b.gateway("a", "")
	id := e2e.NewEventID()

	impatient := e2e.NewClient(1, time.Second)
	defer impatient.CloseIdleConnections()
	_, err := e2e.Deliver(context.Background(), impatient, g.URL(), b.secret, id)
	require.Error(t, err, "the provider times out after 1s")

	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	require.NoError(t, b.up.WaitFor(ctx, id, func(cs []e2e.Call) bool { return len(cs) == 1 && !cs[0].Done.IsZero() }))
	calls := b.up.Calls(id)
	require.True(t, calls[0].Success(), "the upstream finished its work and answered 200 (status %d)", calls[0].Status)
	require.GreaterOrEqual(t, calls[0].Done.Sub(calls[0].At), 3*time.Second)

	row := b.waitState(id, "completed")
	require.Equal(t, 200, row.Status)
	r := b.deliver(g, id)
	require.Equal(t, 200, r.Status)
	require.True(t, r.Replayed, "Idempotent-Replayed: true")
	require.JSONEq(t, `{"received":true,"duplicate":true}`, r.Body)
	require.Len(t, b.up.Calls(id), 1)
	require.Equal(t, 1, b.up.Successes(id))
}

// The upstream refuses connections: the proxy error releases the claim at
// once (the lease is 30s and nobody waits for it), and once the upstream is
// up the retry is forwarded, through either instance.
func TestUpstreamRefusedReleasesClaim(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	port, err := e2e.FreePort()
	require.NoError(t, err)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) // nothing listens yet
	ga := b.gateway("a", addr, "lease 30s")
	gb := b.gateway("b", addr, "lease 30s")
	id := e2e.NewEventID()

	for _, g := range []*e2e.Gateway{ga, gb, ga} {
		r := b.deliver(g, id)
		require.Equal(t, 502, r.Status, "proxy error passed on (via %s)", g.Name)
		// Released before the answer went out: no wait for the lease.
		row, ok := b.row(id)
		require.True(t, ok)
		require.Equal(t, "released", row.State, "via %s", g.Name)
		require.False(t, row.Live)
	}
	row, _ := b.row(id)
	require.Equal(t, 3, row.Attempts, "each delivery claimed the event again")

	up, err := e2e.ListenUpstream(addr, nil)
	require.NoError(t, err)
	t.Cleanup(up.Close)
	r := b.deliver(gb, id)
	require.True(t, r.Forwarded(), "retry forwarded once the upstream is up: %d %s", r.Status, r.Body)
	// The completion is written just after the answer: the other gateway
	// reads the event in flight (409) until it is.
	require.Equal(t, "completed", b.waitState(id, "completed").State)
	r = b.deliver(ga, id)
	require.True(t, r.Status == 200 && r.Replayed, "then a duplicate: %d", r.Status)
	require.Len(t, up.Calls(id), 1)
	require.Equal(t, 1, up.Successes(id))
}

// The upstream takes 3.5s, more than three leases of 1s: the gateway keeps
// renewing the lease, so redeliveries hitting both instances all the while
// are refused (409) and never forwarded.
func TestSlowUpstreamHeartbeat(t *testing.T) {
	t.Parallel()
	const (
		lease = time.Second
		slow  = 3500 * time.Millisecond
	)
	b := setup(t, func(string, int) e2e.Answer { return e2e.Answer{Delay: slow} })
	ga := b.gateway("a", "", "lease 1s")
	gb := b.gateway("b", "", "lease 1s")
	id := e2e.NewEventID()

	first := b.deliverForwarded(ga, id)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	forwardStart := b.up.Calls(id)[0].At

	// Four senders, alternating instances, every 100ms until the first
	// delivery is answered, then once more each.
	var (
		got  collector
		wg   sync.WaitGroup
		done = make(chan struct{})
	)
	for s := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			gws := []*e2e.Gateway{ga, gb}
			for i := 0; i < 100; i++ {
				select {
				case <-done:
					i = 100 // one last delivery after the first was answered
				default:
				}
				r, err := e2e.Deliver(ctx, b.client, gws[(s+i)%2].URL(), b.secret, id)
				if err != nil {
					r.Body = err.Error()
				}
				got.add(r)
				time.Sleep(100 * time.Millisecond)
			}
		}()
	}
	r1 := <-first
	close(done)
	wg.Wait()

	require.True(t, r1.Forwarded(), "the first delivery gets the upstream's 200: %d %s", r1.Status, r1.Body)
	rs := got.all()
	late := 0
	for _, r := range rs {
		switch {
		case r.Status == 409:
			require.GreaterOrEqual(t, r.RetryAfterSeconds(), 1)
			if r.Start.Sub(forwardStart) > 3*lease {
				late++
			}
		case r.Status == 200 && r.Replayed:
		default:
			t.Fatalf("redelivery during a slow forward: %d %s (all: %s)", r.Status, r.Body, summary(rs))
		}
	}
	require.Positive(t, late, "some redeliveries came after three leases and were still refused")
	require.Len(t, b.up.Calls(id), 1, "no duplicate forward")
	require.Equal(t, 1, b.up.Successes(id))
	t.Logf("%d redeliveries during a %s forward with lease %s: %d refused after 3 leases; upstream calls: 1",
		len(rs), slow, lease, late)
}

// The upstream hangs past forward_timeout: the gateway gives up on the
// forward (a 5xx to the provider). Whether the upstream did the work is
// unknown. With on_ambiguous reforward the claim is released and the retry
// is forwarded; with on_ambiguous hold the event is parked as held at once
// (well within its 30s lease): its deliveries are answered 503, never
// forwarded, and an operator's complete works right away (issue 10, 4).
func TestForwardTimeout(t *testing.T) {
	t.Parallel()
	for _, policy := range []string{"reforward", "hold"} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			b := setup(t, func(_ string, n int) e2e.Answer {
				if n == 1 {
					return e2e.Answer{Delay: 10 * time.Second}
				}
				return e2e.Answer{}
			})
			g := b.adminGateway("a", b.up.Addr(), "lease 30s", "forward_timeout 1s", "on_ambiguous "+policy)
			id := e2e.NewEventID()

			r := b.deliver(g, id)
			require.GreaterOrEqual(t, r.Status, 500, "forward cut by forward_timeout: %d %s", r.Status, r.Body)
			require.False(t, r.OK())
			calls := b.up.Calls(id)
			require.Len(t, calls, 1)

			if policy == "reforward" {
				row, ok := b.row(id)
				require.True(t, ok)
				require.Equal(t, "released", row.State, "released at once")
				require.Equal(t, 1, row.Ambiguous)
				require.Regexp(t, `^ambiguous_released/5\d\d$`, deliveryLines(t, g, id, 1)[0], "never counted as a plain release")
				r = b.deliver(g, id)
				require.True(t, r.Forwarded(), "the retry is forwarded: %d", r.Status)
				require.Len(t, b.up.Calls(id), 2)
				require.Equal(t, 1, b.up.Successes(id))
				require.Equal(t, "completed", b.waitState(id, "completed").State)
				return
			}
			row, ok := b.row(id)
			require.True(t, ok)
			require.Equal(t, "held", row.State, "held at once, not when the lease runs out")
			require.False(t, row.Live)
			requireGaugeZero(t, g)
			require.Regexp(t, `^ambiguous/5\d\d$`, deliveryLines(t, g, id, 1)[0])
			for range 2 {
				r = b.deliver(g, id)
				require.Equal(t, 503, r.Status, "a retry within the lease: held, not in flight: %s", r.Body)
				require.Equal(t, -1, r.RetryAfterSeconds(), "held: no Retry-After, nothing changes until an operator acts")
			}
			require.Len(t, b.up.Calls(id), 1, "never forwarded again")
			require.Zero(t, b.up.Successes(id))

			status, body, err := g.AdminCall(context.Background(), http.MethodPost, "/webhook_idempotency/events/stripe/"+id+"/complete")
			require.NoError(t, err)
			require.Equal(t, 200, status, "an operator completes it at once: %s", body)
			r = b.deliver(g, id)
			require.True(t, r.Status == 200 && r.Replayed, "then a duplicate: %d", r.Status)
			require.Len(t, b.up.Calls(id), 1)
		})
	}
}
