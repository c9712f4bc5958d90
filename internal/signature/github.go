package signature

import "time"

// GitHub: X-Hub-Signature-256: sha256=<hex>, HMAC-SHA256 of the body. The
// legacy X-Hub-Signature: sha1=<hex> is read only with allow_sha1 and only
// when X-Hub-Signature-256 is absent, so a bad SHA-256 signature is never
// rescued by a SHA-1 one.
//
// The delivery ID header is not signed and there is no timestamp, hence
// DedupeBody.
func init() {
	register(Preset{ //nolint:gosec // G101: SecretFormat and WrongSecrets describe secrets, hold none
		Name: "github",
		Delivery: Delivery{
			Retry:   Retry{Note: "failed deliveries are redelivered only by hand or by a script using the REST API", Source: "https://docs.github.com/en/webhooks/using-webhooks/handling-failed-webhook-deliveries"},
			MaxBody: MaxBody{Bytes: 25 << 20, Note: "25 MB in the document, read as MiB so no body under the cap is refused; a larger event is not delivered", Source: "https://docs.github.com/en/webhooks/webhook-events-and-payloads#payload-cap"},
			Timeout: Timeout{Duration: 10 * time.Second, Source: "https://docs.github.com/en/webhooks/using-webhooks/best-practices-for-using-webhooks#respond-within-10-seconds"},
			Answer:  Answer{Note: "within 10 seconds", Source: "https://docs.github.com/en/webhooks/using-webhooks/best-practices-for-using-webhooks#respond-within-10-seconds"},
			Refusal: Refusal{Source: Undocumented},
		},
		Doc:             "https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries",
		SignatureHeader: "X-Hub-Signature-256: sha256=<hex> (X-Hub-Signature: sha1=<hex> with allow_sha1)",
		EventID:         ids(headerID("X-GitHub-Delivery")),
		DedupeBody:      true,
		Oracle:          "@octokit/webhooks-methods",
		IDStability:     StabilityStable, // a redelivery keeps the delivery GUID
		SecretFormat:    "the webhook's secret as typed in its settings (Settings → Webhooks → Secret, or the app's webhook secret), never a GitHub token",
		WrongSecrets: []WrongSecret{
			{Prefix: "ghp_", What: "a personal access token"},
			{Prefix: "github_pat_", What: "a fine-grained personal access token"},
			{Prefix: "gho_", What: "an OAuth token"},
			{Prefix: "ghu_", What: "a user access token"},
			{Prefix: "ghs_", What: "an installation access token"},
			{Prefix: "ghr_", What: "a refresh token"},
		},
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "X-Hub-Signature-256"}},
			Format:    Format{Prefix: "sha256="},
			Signed:    "{body}",
			Algorithm: "sha256",
			Encoding:  "hex",
			Legacy:    &LegacyHeader{Header: "X-Hub-Signature", Prefix: "sha1=", Algorithm: "sha1"},
		},
	})
}
