package signature

// Shopify: X-Shopify-Hmac-Sha256: <base64>, HMAC-SHA256 of the body keyed
// with the app's client secret. No timestamp and the ID headers are not
// signed, hence DedupeBody. X-Shopify-Event-Id is the same for every
// subscription of one event; X-Shopify-Webhook-Id is per delivery.
func init() {
	register(Preset{
		Name:            "shopify",
		Doc:             "https://shopify.dev/docs/apps/build/webhooks/subscribe/https#step-5-verify-the-webhook",
		SignatureHeader: "X-Shopify-Hmac-Sha256: <base64>",
		EventID:         ids(headerID("X-Shopify-Event-Id"), headerID("X-Shopify-Webhook-Id")),
		DedupeBody:      true,
		IDStability:     StabilityStable, // Shopify: X-Shopify-Event-Id identifies duplicates
		Oracle:          "@shopify/shopify-api",
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "X-Shopify-Hmac-Sha256"}},
			Signed:    "{body}",
			Algorithm: "sha256",
			Encoding:  "base64",
		},
	})
}
