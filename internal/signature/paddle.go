package signature

import "time"

// Paddle Billing: Paddle-Signature: ts=<ts>;h1=<hex>, HMAC-SHA256 of
// "<ts>:<body>" keyed with the notification destination's secret key, as
// written (pdl_ntfset_...). Several h1 entries (Paddle sends two while a
// secret rotates) are all tried; field order does not matter.
func init() {
	register(Preset{
		Name: "paddle",
		Delivery: Delivery{
			Retry:   Retry{Retries: true, For: 3 * 24 * time.Hour, Note: "live: up to 60 retries with exponential backoff; sandbox: 3 retries within 15 minutes", Source: "https://developer.paddle.com/webhooks/respond-to-webhooks"},
			Timeout: Timeout{Duration: 5 * time.Second, Source: "https://developer.paddle.com/webhooks/respond-to-webhooks"},
			Answer:  Answer{Status: 200, Note: "within 5 seconds, before processing", Source: "https://developer.paddle.com/webhooks/respond-to-webhooks"},
			MaxBody: MaxBody{Source: Undocumented},
			Refusal: Refusal{Source: Undocumented},
		},
		Doc:              "https://developer.paddle.com/webhooks/signature-verification",
		SignatureHeader:  "Paddle-Signature: ts=<ts>;h1=<hex>",
		DefaultTolerance: 5 * time.Minute,
		EventID:          ids(jsonID("event_id")),
		Oracle:           "@paddle/paddle-node-sdk",
		IDStability:      StabilityStable,
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "Paddle-Signature"}},
			Format:    Format{List: ";", Pair: "=", SigKey: "h1", TimestampKey: "ts"},
			Signed:    "{timestamp}:{body}",
			Algorithm: "sha256",
			Encoding:  "hex",
		},
	})
}
