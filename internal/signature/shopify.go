package signature

import "time"

// Shopify: X-Shopify-Hmac-Sha256: <base64>, HMAC-SHA256 of the body keyed
// with the app's client secret. No timestamp and the ID headers are not
// signed, hence DedupeBody. X-Shopify-Event-Id is the same for every
// subscription of one event; X-Shopify-Webhook-Id is per delivery.
func init() {
	register(Preset{
		Name: "shopify",
		Delivery: Delivery{
			Retry:   Retry{Retries: true, For: 4 * time.Hour, Note: "retried 8 times with exponential backoff, with the original payload", Source: "https://shopify.dev/changelog/updates-to-webhook-retry-mechanism"},
			Timeout: Timeout{Duration: 5 * time.Second, Note: "1 s to connect", Source: "https://shopify.dev/docs/apps/build/webhooks/subscribe/https"},
			Answer:  Answer{Note: "a 200-series status within 5 seconds", Source: "https://shopify.dev/docs/apps/build/webhooks/subscribe/https"},
			MaxBody: MaxBody{Source: Undocumented},
			// Not Status 401: only the compliance topics require it, and
			// their route sets refuse_status 401 (docs/presets.md).
			Refusal: Refusal{
				Note:   "401 is required of a mandatory compliance webhook whose HMAC header is invalid; other topics state none",
				Source: "https://shopify.dev/docs/apps/store/security/gdpr-webhooks",
			},
		},
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
