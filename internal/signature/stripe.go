package signature

import "time"

// Stripe: Stripe-Signature: t=<ts>,v1=<hex>[,v1=<hex>...], HMAC-SHA256 of
// "<ts>.<body>" keyed with the whole secret string, whsec_ prefix included.
// Other schemes (v0) are ignored; two t= fields are refused.
//
// stripe-go, the conformance oracle, also refuses a correctly signed body
// that is not a JSON event, and so does this preset (JSONBody).
func init() {
	register(Preset{ //nolint:gosec // G101: SecretFormat describes a secret, holds none
		Name: "stripe",
		Delivery: Delivery{
			Retry:   Retry{Retries: true, For: 3 * 24 * time.Hour, Note: "exponential backoff in live mode; a sandbox retries 3 times over a few hours", Source: "https://docs.stripe.com/webhooks#automatic-retries"},
			Answer:  Answer{Note: "return it before any complex logic", Source: "https://docs.stripe.com/webhooks#acknowledge-events-immediately"},
			MaxBody: MaxBody{Source: Undocumented},
			// "Timed out" is explained without a figure.
			Timeout: Timeout{Source: Undocumented},
			Refusal: Refusal{Source: Undocumented},
		},
		Doc:              "https://docs.stripe.com/webhooks#verify-manually",
		SignatureHeader:  "Stripe-Signature: t=<ts>,v1=<hex>",
		DefaultTolerance: 5 * time.Minute,
		EventID:          ids(jsonID("id")),
		Oracle:           "stripe",
		IDStability:      StabilityStable, // a retried event keeps its evt_ ID
		SecretFormat:     "the webhook endpoint's signing secret, `whsec_…` (the endpoint's page in the Dashboard, or what `stripe listen` prints), never an API key",
		WrongSecrets: []WrongSecret{
			{Prefix: "sk_", What: "a secret API key"},
			{Prefix: "rk_", What: "a restricted API key"},
			{Prefix: "pk_", What: "a publishable API key"},
		},
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "Stripe-Signature"}},
			Format:    Format{List: ",", Pair: "=", SigKey: "v1", TimestampKey: "t"},
			Signed:    "{timestamp}.{body}",
			Algorithm: "sha256",
			Encoding:  "hex",
			JSONBody:  true,
		},
	})
}
