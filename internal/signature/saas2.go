package signature

import "time"

// Support desks, analytics, content and collaboration platforms beyond
// saas.go. Each is data for the generic engine.
func init() {
	// Zendesk: base64 HMAC-SHA256 of the timestamp header (RFC 3339, e.g.
	// 2021-03-25T05:09:27Z) followed by the body, per "Verifying webhook
	// authenticity" (an older copy of that page showed body then timestamp;
	// the current text and the anatomy page say timestamp then body).
	// Zendesk documents no tolerance, so the five minutes every timestamped
	// preset uses apply. Event-subscription payloads carry an id;
	// trigger and automation payloads are the user's, so configure one there.
	register(Preset{
		Name:             "zendesk",
		Doc:              "https://developer.zendesk.com/documentation/webhooks/verifying/",
		SignatureHeader:  "X-Zendesk-Webhook-Signature: <base64> (with X-Zendesk-Webhook-Signature-Timestamp, RFC 3339)",
		DefaultTolerance: 5 * time.Minute,
		EventID:          ids(jsonID("id")),
		Scheme: Scheme{
			Headers:         []HeaderSet{{Signature: "X-Zendesk-Webhook-Signature", Timestamp: "X-Zendesk-Webhook-Signature-Timestamp"}},
			Signed:          "{timestamp}{body}",
			Algorithm:       "sha256",
			Encoding:        "base64",
			TimestampLayout: time.RFC3339Nano,
		},
	})
	// Segment (Webhooks destination, Classic and Actions): X-Signature, the
	// hex HMAC-SHA1 of the body under the destination's shared secret.
	// messageId is Segment's per-message ID. Segment signs only the first
	// event of a batched Actions request, so batching must stay off: a batch
	// never verifies here.
	register(Preset{
		Name:            "segment",
		Doc:             "https://segment.com/docs/connections/destinations/catalog/actions-webhook/",
		SignatureHeader: "X-Signature: <hex>",
		EventID:         ids(jsonID("messageId")),
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "X-Signature"}},
			Signed:    "{body}",
			Algorithm: "sha1",
			Encoding:  "hex",
		},
	})
	// ClickUp: X-Signature, the hex HMAC-SHA256 of the body under the
	// webhook's secret. Payloads carry no event ID: configure one.
	register(Preset{
		Name:            "clickup",
		Doc:             "https://developer.clickup.com/docs/webhooksignature",
		SignatureHeader: "X-Signature: <hex>",
		DedupeBody:      true,
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "X-Signature"}},
			Signed:    "{body}",
			Algorithm: "sha256",
			Encoding:  "hex",
		},
	})
	// Sanity GROQ-powered webhooks: "t=<ms>,v1=<base64url>" over
	// "<t>.<body>" (the official @sanity/webhook toolkit). The toolkit does
	// not bound the timestamp's age; this preset does (five minutes). The
	// payload is the user's GROQ projection: configure an event ID.
	register(Preset{
		Name:             "sanity",
		Doc:              "https://github.com/sanity-io/webhook-toolkit#readme",
		SignatureHeader:  "sanity-webhook-signature: t=<ms>,v1=<base64url>",
		DefaultTolerance: 5 * time.Minute,
		Oracle:           "@sanity/webhook",
		Scheme: Scheme{
			Headers:       []HeaderSet{{Signature: "sanity-webhook-signature"}},
			Format:        Format{List: ",", Pair: "=", SigKey: "v1", TimestampKey: "t"},
			Signed:        "{timestamp}.{body}",
			Algorithm:     "sha256",
			Encoding:      "base64url",
			TimestampUnit: time.Millisecond,
		},
	})
	// Liveblocks and Lithic deliver through Svix with the webhook-* headers
	// of Standard Webhooks and whsec_ secrets.
	register(standardBased("liveblocks", "https://liveblocks.io/docs/platform/webhooks", "whsec", "@liveblocks/node"))
	register(standardBased("lithic", "https://github.com/lithic-com/lithic-go/blob/main/webhook.go", "whsec", "lithic"))
	// AfterShip Tracking: aftership-hmac-sha256, the base64 HMAC-SHA256 of
	// the body under the account's webhook secret. No event ID is
	// documented: configure one.
	register(Preset{
		Name:            "aftership",
		Doc:             "https://www.aftership.com/docs/tracking/webhook/webhook-signature",
		SignatureHeader: "aftership-hmac-sha256: <base64>",
		DedupeBody:      true,
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "aftership-hmac-sha256"}},
			Signed:    "{body}",
			Algorithm: "sha256",
			Encoding:  "base64",
		},
	})
}
