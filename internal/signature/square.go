package signature

import "time"

// Square: x-square-hmacsha256-signature: <base64>, HMAC-SHA256 of the
// notification URL (exactly as configured at Square, query included, no
// added slash) followed by the body; the signature key is used verbatim. The
// legacy x-square-signature (HMAC-SHA1) is not read.
func init() {
	register(Preset{
		Name: "square",
		Delivery: Delivery{
			Retry:   Retry{Retries: true, For: 24 * time.Hour, Note: "for 24 hours (copies of the page have also said 72 hours), then the notification is discarded", Source: "https://developer.squareup.com/docs/webhooks/troubleshooting"},
			Timeout: Timeout{Duration: 10 * time.Second, Source: "https://developer.squareup.com/docs/webhooks/troubleshooting"},
			Answer:  Answer{Note: "as soon as possible", Source: "https://developer.squareup.com/docs/webhooks/troubleshooting"},
			MaxBody: MaxBody{Source: Undocumented},
			Refusal: Refusal{Source: Undocumented},
		},
		Doc:             "https://developer.squareup.com/docs/webhooks/step3validate",
		SignatureHeader: "x-square-hmacsha256-signature: <base64>",
		EventID:         ids(jsonID("event_id")),
		NeedsURL:        true,
		Oracle:          "square",
		IDStability:     StabilityStable, // Square: event_id to handle duplicate notifications
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "x-square-hmacsha256-signature"}},
			Signed:    "{url}{body}",
			Algorithm: "sha256",
			Encoding:  "base64",
		},
	})
}
