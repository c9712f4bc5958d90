package signature_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
)

// Every preset says what its default event ID does across retries; a
// per-delivery ID is never a default (WooCommerce's X-WC-Webhook-Delivery-ID
// was one), and a preset without a default says so.
func TestIDStability(t *testing.T) {
	t.Parallel()
	for _, name := range signature.Providers() {
		p, _ := signature.Lookup(name)
		require.Contains(t, []signature.Stability{signature.StabilityStable, signature.StabilityUndocumented, signature.StabilityNone}, p.IDStability, name)
		require.Equal(t, len(p.EventID) == 0, p.IDStability == signature.StabilityNone, name)
	}
	for name, want := range map[string]signature.Stability{
		"woocommerce": signature.StabilityNone,
		"stripe":      signature.StabilityStable,
		"twitch":      signature.StabilityStable,
		"mailgun":     signature.StabilityStable,
		"resend":      signature.StabilityStable,
		"gitlab":      signature.StabilityStable,
	} {
		p, _ := signature.Lookup(name)
		require.Equal(t, want, p.IDStability, name)
	}
	wc, _ := signature.Lookup("woocommerce")
	require.Empty(t, wc.EventID, "X-WC-Webhook-Delivery-ID changes on every delivery")
	require.True(t, wc.DedupeBody)
}

func TestTableTolerances(t *testing.T) {
	t.Parallel()
	table := signature.MarkdownTable()
	for _, row := range []string{"| `twitch` |", "| `box` |", "| `stripe` |", "| `linear` |", "| `workos` |"} {
		require.Contains(t, table, row)
	}
	require.Regexp(t, "\\| `twitch` \\|[^\\n]*\\| 10m \\|", table)
	require.Regexp(t, "\\| `box` \\|[^\\n]*\\| 10m \\|", table)
	require.Regexp(t, "\\| `stripe` \\|[^\\n]*\\| 5m \\|", table)
	require.Regexp(t, "\\| `linear` \\|[^\\n]*\\| 1m \\|", table)
	require.Regexp(t, "\\| `workos` \\|[^\\n]*\\| 3m \\|", table)
}
