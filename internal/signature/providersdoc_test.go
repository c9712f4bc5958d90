package signature

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// docs/providers.md is generated from the presets (go generate
// ./internal/signature): this test fails when the file is stale.
func TestProvidersDoc(t *testing.T) {
	t.Parallel()
	got, err := os.ReadFile("../../docs/providers.md")
	require.NoError(t, err, "docs/providers.md is missing; run go generate ./internal/signature")
	require.Equal(t, ProvidersDoc(), string(got), "docs/providers.md is stale; run go generate ./internal/signature")
}

// Every preset's delivery facts are researched: each names its source or
// says the provider does not document it.
func TestDeliveryFacts(t *testing.T) {
	t.Parallel()
	for _, name := range Providers() {
		p := registry[name]
		if unresearched[name] {
			require.False(t, p.Delivery.Researched(), "%s is researched now: remove it from unresearched", name)
			continue
		}
		require.True(t, p.Delivery.Researched(), "%s: every delivery fact needs a Source (a document or Undocumented)", name)
	}
}

// unresearched lists the presets whose delivery facts are still to be
// looked up; it only shrinks.
var unresearched = map[string]bool{
	"airwallex":    true,
	"authorizenet": true,
	"braintree":    true,
	"chargebee":    true,
	"fastspring":   true,
	"flutterwave":  true,
	"mercadopago":  true,
	"midtrans":     true,
	"mollie":       true,
	"rapyd":        true,
	"recurly":      true,
	"revolut":      true,
	"xendit":       true,
	"adyen":        true,
	"alchemy":      true,
	"asana":        true,
	"bitbucket":    true,
	"box":          true,
	"buildkite":    true,
	"calcom":       true,
	"calendly":     true,
	"checkout":     true,
	"circleci":     true,
	"clerk":        true,
	"coinbase":     true,
	"customerio":   true,
	"discord":      true,
	"docusign":     true,
	"dropbox":      true,
	"easypost":     true,
	"forgejo":      true,
	"gitea":        true,
	"github":       true,
	"gitlab":       true,
	"gocardless":   true,
	"heroku":       true,
	"hmac":         true,
	"hubspot":      true,
	"intercom":     true,
	"intuit":       true,
	"lemonsqueezy": true,
	"linear":       true,
	"mailgun":      true,
	"meta":         true,
	"msgraph":      true,
	"mux":          true,
	"notion":       true,
	"okta":         true,
	"openai":       true,
	"paddle":       true,
	"pagerduty":    true,
	"paystack":     true,
	"persona":      true,
	"polar":        true,
	"razorpay":     true,
	"replicate":    true,
	"resend":       true,
	"sendgrid":     true,
	"sentry":       true,
	"shopify":      true,
	"slack":        true,
	"square":       true,
	"standard":     true,
	"stripe":       true,
	"svix":         true,
	"telnyx":       true,
	"trello":       true,
	"twilio":       true,
	"twitch":       true,
	"typeform":     true,
	"vercel":       true,
	"webflow":      true,
	"woocommerce":  true,
	"workos":       true,
	"xero":         true,
	"zoom":         true,
}
