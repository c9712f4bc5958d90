package e2e_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/e2e"
)

// crashLease is the lease of the crash tests: short, so the tests wait for it
// to run out, long against the heartbeat (every lease/3).
const crashLease = 3 * time.Second

// crashMidForward delivers an event to gateway A, whose upstream call takes
// far longer than the test, and kills A's process group (SIGKILL) while it
// forwards. It returns the surviving gateway B, on the same database.
func crashMidForward(t *testing.T, b *bundle, id string, extra ...string) (survivor *e2e.Gateway) {
	t.Helper()
	extra = append([]string{"lease " + crashLease.String()}, extra...)
	a := b.gateway("a", "", extra...)
	survivor = b.gateway("b", "", extra...)

	first := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := e2e.Deliver(ctx, b.client, a.URL(), b.secret, id)
		first <- err
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	require.NoError(t, b.up.WaitFor(ctx, id, func(cs []e2e.Call) bool { return len(cs) == 1 }), "first forward reached the upstream")
	row, ok := b.row(id)
	require.True(t, ok)
	require.Equal(t, "processing", row.State)

	a.Kill()
	require.Error(t, <-first, "the provider's connection to the killed gateway breaks")
	// The upstream sees the killed gateway's connection go: that call did no
	// work and answered nothing.
	require.NoError(t, b.up.WaitFor(ctx, id, func(cs []e2e.Call) bool { return !cs[0].Done.IsZero() }))
	require.Zero(t, b.up.Successes(id))

	// At once, the claim is still live: B answers 409 + Retry-After.
	r := b.deliver(survivor, id)
	require.Equal(t, 409, r.Status, r.Body)
	require.GreaterOrEqual(t, r.RetryAfterSeconds(), 1)
	return survivor
}

// slowFirstCall makes the first call of every event hang for a minute (the
// gateway is killed meanwhile) and later calls answer 200 at once.
func slowFirstCall(_ string, n int) e2e.Answer {
	if n == 1 {
		return e2e.Answer{Delay: time.Minute}
	}
	return e2e.Answer{}
}

// on_ambiguous reforward (the default): after the dead gateway's lease runs
// out, exactly one redelivery is forwarded, through the other instance, and
// later ones are duplicates.
func TestKillMidForwardReforwards(t *testing.T) {
	t.Parallel()
	b := setup(t, slowFirstCall)
	id := e2e.NewEventID()
	bgw := crashMidForward(t, b, id)

	rs := b.deliverUntil(bgw, id, 200*time.Millisecond, 75, func(r e2e.Result) bool { return r.Status != 409 })
	last := rs[len(rs)-1]
	require.True(t, last.Forwarded(), "after the lease, the retry is forwarded: %s", summary(rs))
	require.Equal(t, 200, last.Status)
	for _, r := range rs[:len(rs)-1] {
		require.GreaterOrEqual(t, r.RetryAfterSeconds(), 1, "409 carries Retry-After: %s", summary(rs))
	}

	// More redeliveries are answered at the edge.
	for range 3 {
		r := b.deliver(bgw, id)
		require.True(t, r.Status == 200 && r.Replayed, "duplicate after the reforward: %d", r.Status)
	}
	calls := b.up.Calls(id)
	require.Len(t, calls, 2, "the killed forward and exactly one retry")
	require.Equal(t, 1, b.up.Successes(id))
	row := b.waitState(id, "completed")
	require.Equal(t, 2, row.Attempts)
	t.Logf("after SIGKILL, deliveries to the survivor: %s; upstream calls 2 (killed, retry), successes 1", summary(rs))
}

// on_ambiguous hold: after the dead gateway's lease runs out, the event is
// parked as held; its deliveries get 503 (no Retry-After) and none is forwarded.
func TestKillMidForwardHolds(t *testing.T) {
	t.Parallel()
	b := setup(t, slowFirstCall)
	id := e2e.NewEventID()
	bgw := crashMidForward(t, b, id, "on_ambiguous hold")

	var rs []e2e.Result
	held := 0
	for deadline := time.Now().Add(4 * crashLease); time.Now().Before(deadline) && held < 5; time.Sleep(200 * time.Millisecond) {
		r := b.deliver(bgw, id)
		rs = append(rs, r)
		switch r.Status {
		case 409:
			require.Zero(t, held, "never live again once held: %s", summary(rs))
		case 503:
			held++
			require.Equal(t, -1, r.RetryAfterSeconds(), "503 held: no Retry-After, nothing changes until an operator acts")
		default:
			t.Fatalf("unexpected answer: %s", summary(rs))
		}
	}
	require.Equal(t, 5, held, "deliveries after the lease are answered 503 (held): %s", summary(rs))
	require.Len(t, b.up.Calls(id), 1, "nothing forwarded after the crash")
	require.Zero(t, b.up.Successes(id))
	row, ok := b.row(id)
	require.True(t, ok)
	require.Equal(t, "held", row.State)
	require.Equal(t, 1, row.Attempts)
	t.Logf("after SIGKILL, deliveries to the survivor: %s; upstream calls 1 (killed), row held", summary(rs))
}
