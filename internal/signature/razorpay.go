package signature

import "time"

// Razorpay: X-Razorpay-Signature: <hex>, HMAC-SHA256 of the body keyed with
// the webhook secret. The event ID header is not signed and there is no
// timestamp, hence DedupeBody.
func init() {
	register(Preset{
		Name: "razorpay",
		Delivery: Delivery{
			Retry:   Retry{Retries: true, For: 24 * time.Hour, Note: "exponential backoff from the event's creation; the webhook is disabled after 24 hours of failures", Source: "https://razorpay.com/docs/webhooks/best-practices"},
			Answer:  Answer{Source: "https://razorpay.com/docs/webhooks/best-practices"},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Source: Undocumented},
			Refusal: Refusal{Note: "any non-2xx is a failed delivery, retried; 24 hours of failures disable the webhook", Source: "https://razorpay.com/docs/webhooks/best-practices"},
		},
		Doc:             "https://razorpay.com/docs/webhooks/validate-test/",
		SignatureHeader: "X-Razorpay-Signature: <hex>",
		EventID:         ids(headerID("X-Razorpay-Event-Id")),
		DedupeBody:      true,
		Oracle:          "razorpay",
		IDStability:     StabilityStable, // Razorpay: the same for retries of one event
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "X-Razorpay-Signature"}},
			Signed:    "{body}",
			Algorithm: "sha256",
			Encoding:  "hex",
		},
	})
}
