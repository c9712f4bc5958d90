package signature

import "time"

// Paddle Billing: Paddle-Signature: ts=<ts>;h1=<hex>, HMAC-SHA256 of
// "<ts>:<body>" keyed with the notification destination's secret key, as
// written (pdl_ntfset_...). Several h1 entries (Paddle sends two while a
// secret rotates) are all tried; field order does not matter.
func init() {
	register(Preset{
		Name:             "paddle",
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
