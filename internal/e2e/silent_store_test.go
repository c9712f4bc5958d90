package e2e_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/e2e"
)

// One gateway, a Stripe route (no spool: a failed delivery is Stripe's to
// redeliver) and a GitHub route (spool on by default), its store behind a
// relay that accepts connections but never answers them (a load balancer
// whose backend is gone) for 15 s while deliveries arrive on both: Stripe's
// are answered 503, GitHub's kept in the spool. Once the relay passes
// connections on again, a Stripe delivery is forwarded within seconds;
// every spooled GitHub delivery is forwarded exactly once.
//
// Found in a trial: Stripe deliveries were answered 503 for 45 to 105 s
// after the relay was back. The store's pool counted connections still
// opening through the silent relay (pgxpool lets an opening outlive its
// caller, bounded by 2 minutes when the DSN sets no connect_timeout)
// against its size; they now give up within the store's connect timeout.
func TestDeliveriesRecoverAfterSilentStoreRelay(t *testing.T) {
	t.Parallel()
	b := setup(t, func(string, int) e2e.Answer { return e2e.Answer{} })
	link := b.storeLink()
	dsn := b.db.DSNVia(link.Addr())
	g := b.start(e2e.GatewayConfig{Name: "a", Upstream: b.up.Addr(),
		Handler: e2e.StripeHandler(b.secret, dsn), GitHub: e2e.GitHubHandler(b.secret, dsn)})
	stripe := func(id string) e2e.Result { return b.deliver(g, id) }
	github := func(id string) e2e.Result { return b.deliverGitHub(g.GitHubURL(), id) }
	require.True(t, stripe(e2e.NewEventID()).Forwarded(), "the store is up: forwarded at once")
	require.True(t, github("warm-"+e2e.RandomHex(6)).Forwarded(), "the store is up: forwarded at once")

	// The outage begins with the pool empty, as after a reset that closed
	// its connections: each slot it takes is an opening through the
	// silent relay. A connection still in the pool would be destroyed as
	// the outage begins, and its destruction (pgconn's cancel request,
	// which the relay swallows too, bounded by 15 s) would hold a slot
	// until just after the relay answers again, then free it for the
	// first claim: that hid the openings' 2 minutes.
	link.Cut()
	require.Equal(t, http.StatusServiceUnavailable, stripe(e2e.NewEventID()).Status, "the store's connections are reset")
	link.Restore()
	link.Silence()
	silencedAt := time.Now()
	var (
		spooled []string
		mu      sync.Mutex
		wg      sync.WaitGroup
	)
	for i := range 10 {
		wg.Go(func() {
			r := stripe(e2e.NewEventID())
			require.Equal(t, http.StatusServiceUnavailable, r.Status, "Stripe during the outage: %s", r.Body)
		})
		wg.Go(func() {
			id := fmt.Sprintf("%08x-%04d-4000-8000-%012d", 1, i, i)
			r := github(id)
			require.Equal(t, http.StatusOK, r.Status, "GitHub during the outage: kept in the spool: %s", r.Body)
			mu.Lock()
			spooled = append(spooled, id)
			mu.Unlock()
		})
	}
	time.Sleep(8 * time.Second)
	for range 5 {
		wg.Go(func() {
			r := stripe(e2e.NewEventID())
			require.Equal(t, http.StatusServiceUnavailable, r.Status, "Stripe during the outage: %s", r.Body)
		})
	}
	wg.Wait()
	time.Sleep(time.Until(silencedAt.Add(15 * time.Second)))
	link.Restore()
	restoredAt := time.Now()

	var (
		live     time.Duration
		answered []string
	)
	for range 60 {
		r := stripe(e2e.NewEventID())
		answered = append(answered, fmt.Sprint(r.Status))
		if r.Forwarded() {
			live = time.Since(restoredAt)
			break
		}
		time.Sleep(time.Second)
	}
	require.NotZero(t, live, "no Stripe delivery forwarded within 60 tries after the store answered again: %v", answered)
	// Openings through the silent relay give up within the store's
	// connect timeout (5s), a delivery's claim within its store timeout
	// (5s).
	require.Less(t, live, 12*time.Second, "forwarded only %s after the store answered again: %v", live, answered)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, id := range spooled {
		require.NoError(t, b.up.WaitFor(ctx, id, func(cs []e2e.Call) bool { return len(cs) >= 1 }), "spooled %s forwarded", id)
	}
	time.Sleep(time.Second) // a second forward would show by now
	for _, id := range spooled {
		require.Len(t, b.up.Calls(id), 1, "spooled %s forwarded exactly once", id)
	}
	t.Logf("a Stripe delivery forwarded %s after the store answered again (answers %v); %d spooled GitHub deliveries forwarded once each",
		live.Round(time.Millisecond), answered, len(spooled))
}

// A claim whose answer never came, and whose statement the network held
// and let through later: the delivery is answered 503 (nothing forwarded),
// the store's connection stalls with the claim in it and resumes after
// the gateway gave up, so the claim commits under a token nobody holds.
// The gateway gives such a claim back: the next delivery of the event is
// forwarded at once, not answered 409 for the claim's 30 s lease and then
// forwarded as if a forward had ended with no known outcome (counted
// ambiguous: held at once under on_ambiguous hold).
func TestClaimCommittedAfterItsDeliveryWasAnswered(t *testing.T) {
	t.Parallel()
	b := setup(t, func(string, int) e2e.Answer { return e2e.Answer{} })
	link := b.storeLink()
	g := b.gatewayOn("a", "", b.db.DSNVia(link.Addr()))
	warm := e2e.NewEventID()
	require.True(t, b.deliver(g, warm).Forwarded(), "the store is up: forwarded at once")

	// Its completion written, its connection idle for less than the
	// second after which the pool pings a connection before use: the next
	// claim goes out on it.
	b.waitState(warm, "completed")
	id := e2e.NewEventID()
	link.Stall()
	r := b.deliver(g, id)
	require.Equal(t, http.StatusServiceUnavailable, r.Status, "no answer from the store: %s", r.Body)
	link.Resume() // the claim's statement reaches PostgreSQL and commits now
	resumedAt := time.Now()
	for _, ok := b.row(id); !ok; _, ok = b.row(id) {
		require.Less(t, time.Since(resumedAt), 5*time.Second, "the stalled claim never committed")
		time.Sleep(20 * time.Millisecond)
	}

	var answers []e2e.Result
	forwarded := false
	for range 30 {
		r := b.deliver(g, id)
		answers = append(answers, r)
		if forwarded = r.Forwarded(); forwarded {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	took := time.Since(resumedAt)
	require.True(t, forwarded, "redeliveries after the stalled claim committed: %s", summary(answers))
	require.Less(t, took, 10*time.Second, "forwarded only %s after the claim committed: %s", took, summary(answers))
	row := b.waitState(id, "completed")
	require.Zero(t, row.Ambiguous, "no forward of the event ended unknown")
	require.Len(t, b.up.Calls(id), 1)
	t.Logf("forwarded %s after the stalled claim committed: %s; row attempts %d, ambiguous %d",
		took.Round(time.Millisecond), summary(answers), row.Attempts, row.Ambiguous)
}
