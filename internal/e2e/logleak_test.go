package e2e_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/e2e"
)

// The upstream cuts its answer, with Caddy's global debug option on: Caddy's
// reverse_proxy logs "upstream roundtrip" (DEBUG) and "aborting with
// incomplete response" (WARN) with the request's headers. With the logging
// configuration the README ships, neither the secret nor any signature
// sent is in any log line (the harness checks every gateway's log when it
// is torn down); the same run without it leaks the signature, which shows
// the check finds what it is there to find.
func TestUpstreamCutAnswerLogsNoSecret(t *testing.T) {
	t.Parallel()
	b := setup(t, func(string, int) e2e.Answer { return e2e.Answer{Cut: true} })
	filtered := b.gatewayWith(e2e.GatewayConfig{Name: "filtered", Debug: true}, b.db.DSN)
	unfiltered := b.gatewayWith(e2e.GatewayConfig{Name: "unfiltered", Debug: true, NoLogFilter: true}, b.db.DSN)

	for _, g := range []*e2e.Gateway{filtered, unfiltered} {
		id := e2e.NewEventID()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err := e2e.Deliver(ctx, b.client, g.URL(), b.secret, id)
		cancel()
		require.Error(t, err, "%s: the answer is cut short", g.Name)
		require.Eventually(t, func() bool {
			return logCount(g, "aborting with incomplete response") > 0 && logCount(g, "upstream roundtrip") > 0
		}, 10*time.Second, 50*time.Millisecond, "%s: reverse_proxy logged the cut and the roundtrip", g.Name)
	}

	leaks, err := e2e.FindLeaks(filtered.LogPath(), b.secret)
	require.NoError(t, err)
	require.Empty(t, leaks, "the shipped log filter keeps signatures out of every line")

	leaks, err = e2e.FindLeaks(unfiltered.LogPath(), b.secret)
	require.NoError(t, err)
	require.NotEmpty(t, leaks, "without the filter Caddy's own lines print Stripe-Signature")
	joined := strings.Join(leaks, "\n")
	require.Contains(t, joined, "a signature sent")
	require.Contains(t, joined, "Stripe-Signature")
	require.Contains(t, joined, "aborting with incomplete response")
}
