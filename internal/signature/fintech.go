package signature

import "time"

// Banking, payroll and identity-verification APIs. Each is data for the
// generic engine; the official SDK named in Oracle is the scheme's source.
func init() {
	// Modern Treasury: X-Signature, the hex HMAC-SHA256 of the body under
	// the webhook key (modern-treasury's webhooks.validateSignature).
	// Payloads carry no top-level event ID: configure one.
	register(Preset{ //nolint:gosec // SecretFormat describes the secret; it holds none
		Name:            "moderntreasury",
		SecretFormat:    "the webhook key",
		Delivery:        allUndocumented,
		Doc:             "https://github.com/Modern-Treasury/modern-treasury-node/blob/main/src/resources/webhooks.ts",
		SignatureHeader: "X-Signature: <hex>",
		DedupeBody:      true,
		Oracle:          "modern-treasury",
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "X-Signature"}},
			Signed:    "{body}",
			Algorithm: "sha256",
			Encoding:  "hex",
		},
	})
	// Finch: Standard Webhooks' scheme under finch-* headers ("v1,<base64>"
	// entries over "<finch-event-id>.<finch-timestamp>.<body>"), keyed with
	// the base64-decoded secret; @tryfinch/finch-api allows five minutes.
	register(Preset{
		Name:             "finch",
		Delivery:         allUndocumented,
		Doc:              "https://github.com/Finch-API/finch-api-node/blob/main/src/resources/webhooks.ts",
		SignatureHeader:  "finch-signature: v1,<base64> (with finch-event-id, finch-timestamp)",
		DefaultTolerance: 5 * time.Minute,
		EventID:          ids(headerID("finch-event-id")),
		Oracle:           "@tryfinch/finch-api",
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "finch-signature", Timestamp: "finch-timestamp", ID: "finch-event-id"}},
			Format:    Format{List: " ", Pair: ",", SigKey: "v1", Lenient: true},
			Signed:    "{id}.{timestamp}.{body}",
			Algorithm: "sha256",
			Encoding:  "base64",
			Secret:    "whsec",
		},
	})
	// Onfido (Entrust): X-SHA2-Signature, the hex HMAC-SHA256 of the body
	// under the webhook token (@onfido/api WebhookEventVerifier). Payloads
	// name a resource, not an event: configure an event ID.
	register(Preset{ //nolint:gosec // SecretFormat describes the secret; it holds none
		Name:            "onfido",
		SecretFormat:    "the webhook token",
		Delivery:        allUndocumented,
		Doc:             "https://documentation.identity.entrust.com/api/manual-webhook-signature-verification/",
		SignatureHeader: "X-SHA2-Signature: <hex>",
		DedupeBody:      true,
		Oracle:          "@onfido/api",
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "X-SHA2-Signature"}},
			Signed:    "{body}",
			Algorithm: "sha256",
			Encoding:  "hex",
		},
	})
	// Cashfree Payments: x-webhook-signature, the base64 HMAC-SHA256 of the
	// x-webhook-timestamp header (Unix ms) followed by the body, under the
	// client secret (cashfree-pg's PGVerifyWebhookSignature, which does not
	// bound the timestamp's age; Cashfree recommends a five-minute window,
	// which this preset applies). Payloads carry no event ID: configure one.
	register(Preset{ //nolint:gosec // SecretFormat describes the secret; it holds none
		Name:         "cashfree",
		SecretFormat: "the client secret",
		Delivery: Delivery{
			Retry:   Retry{Retries: true, For: 42 * time.Minute, Attempts: 4, Note: "default policy: 3 retries at 2, 10 and 30 minutes; configurable per endpoint (up to 10 retries)", Source: "https://www.cashfree.com/docs/api-reference/webhooks/reliability-and-operations#retry-policy"},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Source: Undocumented},
			Answer:  Answer{Status: 200, Note: "anything else, 3xx included, is a failed delivery", Source: "https://www.cashfree.com/docs/api-reference/webhooks/reliability-and-operations#retry-policy"},
			Refusal: Refusal{Note: "retried like any failure", Source: "https://www.cashfree.com/docs/api-reference/webhooks/reliability-and-operations#retry-policy"},
		},
		Doc:              "https://www.cashfree.com/docs/payments/online/webhooks/signature-verification",
		SignatureHeader:  "x-webhook-signature: <base64> (with x-webhook-timestamp, ms)",
		DefaultTolerance: 5 * time.Minute,
		Oracle:           "cashfree-pg",
		Scheme: Scheme{
			Headers:       []HeaderSet{{Signature: "x-webhook-signature", Timestamp: "x-webhook-timestamp"}},
			Signed:        "{timestamp}{body}",
			Algorithm:     "sha256",
			Encoding:      "base64",
			TimestampUnit: time.Millisecond,
		},
	})
	// Orb: X-Orb-Signature "v1=<hex>" (several separated by spaces), the
	// HMAC-SHA256 of "v1:<X-Orb-Timestamp>:<body>" under the webhook secret;
	// the timestamp is ISO 8601 without a zone (UTC). orb-billing's
	// webhooks.verifySignature allows five minutes either way. The event's
	// ID is not documented here: configure one.
	register(Preset{
		Name:             "orb",
		Delivery:         allUndocumented,
		Doc:              "https://github.com/orbcorp/orb-typescript/blob/main/src/resources/webhooks.ts",
		SignatureHeader:  "X-Orb-Signature: v1=<hex> (with X-Orb-Timestamp, ISO 8601 UTC)",
		DefaultTolerance: 5 * time.Minute,
		Oracle:           "orb-billing",
		Scheme: Scheme{
			Headers:         []HeaderSet{{Signature: "X-Orb-Signature", Timestamp: "X-Orb-Timestamp"}},
			Format:          Format{List: " ", Pair: "=", SigKey: "v1"},
			Signed:          "v1:{timestamp}:{body}",
			Algorithm:       "sha256",
			Encoding:        "hex",
			TimestampLayout: layoutISOUTC,
		},
	})
	// Coinify: X-Coinify-Webhook-Signature, the lowercase hex HMAC-SHA256
	// of the body under the shared secret; Coinify's page gives a test
	// vector (pinned in TestDocumentedFormulaVectors). No event ID is
	// documented there: configure one.
	register(Preset{
		Name:            "coinify",
		Delivery:        allUndocumented,
		Doc:             "https://coinify.readme.io/docs/webhook-signature",
		SignatureHeader: "X-Coinify-Webhook-Signature: <hex>",
		DedupeBody:      true,
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "X-Coinify-Webhook-Signature"}},
			Signed:    "{body}",
			Algorithm: "sha256",
			Encoding:  "hex",
		},
	})
	// MoonPay: Moonpay-Signature-V2 "t=<ts>,s=<hex>", the HMAC-SHA256 of
	// "<t>.<body>" under the webhook API key (a GET request signs its query
	// string instead; the gateway verifies POSTed bodies). MoonPay states no
	// bound on the timestamp's age: five minutes, as every timestamped
	// preset. Configure an event ID.
	register(Preset{
		Name:             "moonpay",
		Delivery:         allUndocumented,
		Doc:              "https://dev.moonpay.com/reference/reference-webhooks-signature",
		SignatureHeader:  "Moonpay-Signature-V2: t=<ts>,s=<hex>",
		DefaultTolerance: 5 * time.Minute,
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "Moonpay-Signature-V2"}},
			Format:    Format{List: ",", Pair: "=", SigKey: "s", TimestampKey: "t"},
			Signed:    "{timestamp}.{body}",
			Algorithm: "sha256",
			Encoding:  "hex",
		},
	})
	// Fintoc: Fintoc-Signature "t=<ts>,v1=<hex>", the HMAC-SHA256 of
	// "<t>.<body>" under the webhook endpoint's secret; fintoc's
	// WebhookSignature.verifyHeader allows 300 s either way. Configure an
	// event ID.
	register(Preset{
		Name:             "fintoc",
		Delivery:         allUndocumented,
		Doc:              "https://docs.fintoc.com/docs/webhooks-validating",
		SignatureHeader:  "Fintoc-Signature: t=<ts>,v1=<hex>",
		DefaultTolerance: 5 * time.Minute,
		Oracle:           "fintoc",
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "Fintoc-Signature"}},
			Format:    Format{List: ",", Pair: "=", SigKey: "v1", TimestampKey: "t"},
			Signed:    "{timestamp}.{body}",
			Algorithm: "sha256",
			Encoding:  "hex",
		},
	})
	// Zoho Payments: X-Zoho-Webhook-Signature "t=<ms>,v=<hex>", the
	// HMAC-SHA256 of "<t>.<payload>" under the webhook's signing key. Zoho
	// states no bound on the timestamp's age: five minutes, as every
	// timestamped preset. Configure an event ID.
	register(Preset{
		Name: "zohopayments",
		Delivery: Delivery{
			Retry:   Retry{Source: Undocumented},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Duration: 15 * time.Second, Source: "https://zoho.com/in/payments/developerdocs/webhooks/verification"},
			Answer:  Answer{Note: "any 2xx within 15 seconds, before complex logic", Source: "https://zoho.com/in/payments/developerdocs/webhooks/verification"},
			Refusal: Refusal{Source: Undocumented},
		},
		Doc:              "https://zoho.com/in/payments/developerdocs/webhooks/verification",
		SignatureHeader:  "X-Zoho-Webhook-Signature: t=<ms>,v=<hex>",
		DefaultTolerance: 5 * time.Minute,
		Scheme: Scheme{
			Headers:       []HeaderSet{{Signature: "X-Zoho-Webhook-Signature"}},
			Format:        Format{List: ",", Pair: "=", SigKey: "v", TimestampKey: "t"},
			Signed:        "{timestamp}.{body}",
			Algorithm:     "sha256",
			Encoding:      "hex",
			TimestampUnit: time.Millisecond,
		},
	})
}
