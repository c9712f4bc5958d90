package signature

// Razorpay: X-Razorpay-Signature: <hex>, HMAC-SHA256 of the body keyed with
// the webhook secret. The event ID header is not signed and there is no
// timestamp, hence DedupeBody.
func init() {
	register(Preset{
		Name:            "razorpay",
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
