package e2e_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/e2e"
)

// A shutdown shorter than a forward (issue 21, item 3): Caddy's
// grace_period is 1s (the e2e Caddyfile's), the upstream takes 4s, and
// SIGTERM comes 1s into the forward, as a rolling deploy sends it. The
// exit cuts the forward and settles it as ambiguous at once, by the
// route's on_ambiguous: the event is not left processing for its lease
// (30s here), and the restarted gateway answers the provider's retry at
// once: forwarded again under reforward (with its warning), held under
// hold.
func TestShutdownSettlesCutForward(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"reforward", "hold"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := setup(t, func(_ string, n int) e2e.Answer {
				if n == 1 {
					return e2e.Answer{Delay: 4 * time.Second}
				}
				return e2e.Answer{}
			})
			extra := []string{"lease 30s", "forward_timeout 10s", "on_ambiguous " + mode}
			id := e2e.NewEventID()
			a := b.gateway("a", "", extra...)
			first := b.deliverForwarded(a, id)
			time.Sleep(time.Second)
			stopped := time.Now()
			require.True(t, a.Terminate(15*time.Second), "caddy exits")
			took := time.Since(stopped)
			r := <-first
			// Caddy closes the connections still open when its grace period
			// ends, and the cut forward settles as the handler is cleaned
			// up, after that: the provider gets 502 when the answer wins
			// that race, else a closed connection (status 0). Both are
			// retried; what matters is how the event was settled.
			require.Contains(t, []int{502, 0}, r.Status, "no success for a cut forward: %d %s", r.Status, r.Body)
			t.Logf("SIGTERM 1s into a 4s forward: caddy exited after %s; the provider got %d %q", took.Round(100*time.Millisecond), r.Status, r.Body)
			require.Less(t, took, 4*time.Second, "the exit did not wait for the forward")

			row, ok := b.row(id)
			require.True(t, ok)
			require.Equal(t, 1, row.Ambiguous, "the cut forward counts as an ambiguous ending")
			require.Equal(t, 1, logCount(a, `"msg":"forward ended with no known outcome`), "one warning for the cut forward")
			// The warning says why; the delivery line repeats it when the
			// answer was written before Caddy closed the connection.
			require.GreaterOrEqual(t, logCount(a, "Caddy stopped past its grace period while the forward ran"), 1, "its warning says why")

			restarted := b.gateway("a2", "", extra...)
			r2 := b.deliver(restarted, id)
			switch mode {
			case "reforward":
				require.Equal(t, "released", row.State, "released at the exit, not processing until the lease")
				require.True(t, r2.Forwarded(), "the retry after the restart is forwarded at once: %d %s", r2.Status, r2.Body)
				require.Len(t, b.up.Calls(id), 2, "upstream executions: the cut one and the retry")
				require.Equal(t, 1, logCount(restarted, "forwarding an event again that an earlier forward may already have run"))
				require.Equal(t, "completed", b.waitState(id, "completed").State)
			case "hold":
				require.Equal(t, "held", row.State, "held at the exit, not processing until the lease")
				require.Contains(t, row.HoldReason, "may still be running")
				require.Equal(t, 503, r2.Status, r2.Body)
				require.Equal(t, -1, r2.RetryAfterSeconds(), "a hold's answer has no Retry-After")
				require.Len(t, b.up.Calls(id), 1, "upstream executions: the cut one only")
			}
			// The cut call itself ran to its end at the upstream: the exit
			// did not stop it, which is why the event is ambiguous.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			require.NoError(t, b.up.WaitFor(ctx, id, func(cs []e2e.Call) bool { return !cs[0].Done.IsZero() }))
		})
	}
}
