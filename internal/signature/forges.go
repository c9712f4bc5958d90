package signature

import "time"

// Code forges other than GitHub and GitLab: an HMAC-SHA256 of the body in
// one header, no timestamp, delivery IDs in unsigned headers (hence
// DedupeBody). Checked against the providers' documentation; no conformance
// vectors yet. Gitea and Forgejo webhooks whose content type is "form" send
// payload=<json> but sign the JSON: the payload field is verified
// (FormPayload).
func init() {
	register(Preset{
		Name: "bitbucket",
		Delivery: Delivery{
			Retry: Retry{
				Retries: true, Attempts: 3,
				Note:   "only an answer in 500-599 is resent, up to two more times; X-Attempt-Number counts the attempts",
				Source: "https://support.atlassian.com/bitbucket-cloud/docs/troubleshoot-webhooks/",
			},
			MaxBody: MaxBody{Bytes: 256 << 10, Note: "a larger payload may silently not be sent", Source: "https://support.atlassian.com/bitbucket-cloud/docs/troubleshoot-webhooks/"},
			Timeout: Timeout{Duration: 10 * time.Second, Source: "https://support.atlassian.com/bitbucket-cloud/docs/troubleshoot-webhooks/"},
			Answer:  Answer{Note: "answer before any expensive processing", Source: "https://support.atlassian.com/bitbucket-cloud/docs/troubleshoot-webhooks/"},
			Refusal: Refusal{Note: "a 4xx refusal is not resent (only 5xx answers are)", Source: "https://support.atlassian.com/bitbucket-cloud/docs/troubleshoot-webhooks/"},
		},
		Doc:             "https://support.atlassian.com/bitbucket-cloud/docs/manage-webhooks/#Secure-webhooks",
		SignatureHeader: "X-Hub-Signature: sha256=<hex>",
		EventID:         ids(headerID("X-Request-UUID"), headerID("X-Request-Id")),
		DedupeBody:      true,
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "X-Hub-Signature"}},
			Format:    Format{Prefix: "sha256="},
			Signed:    "{body}",
			Algorithm: "sha256",
			Encoding:  "hex",
		},
	})
	register(Preset{
		Name: "gitea",
		// The self-hosted forges document only the delivery timeout (a
		// server setting), nothing of an automatic redelivery.
		Delivery: Delivery{
			Retry:   Retry{Source: Undocumented},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Duration: 5 * time.Second, Note: "the default of [webhook] DELIVER_TIMEOUT, set by the server's administrator", Source: "https://docs.gitea.com/administration/config-cheat-sheet#webhook-webhook"},
			Answer:  Answer{Source: Undocumented},
			Refusal: Refusal{Source: Undocumented},
		},
		Doc:             "https://docs.gitea.com/usage/webhooks",
		SignatureHeader: "X-Gitea-Signature: <hex>",
		EventID:         ids(headerID("X-Gitea-Delivery")),
		DedupeBody:      true,
		// Gitea sends the same HMAC under its older names too (deliver.go).
		CredentialHeaders: []string{"X-Gogs-Signature", "X-Hub-Signature-256", "X-Hub-Signature"},
		build:             withFormPayload,
		covers:            formPayloadCovers,
		overridable:       true,
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "X-Gitea-Signature"}},
			Signed:    "{body}",
			Algorithm: "sha256",
			Encoding:  "hex",
		},
	})
	register(Preset{
		Name: "forgejo",
		// The self-hosted forges document only the delivery timeout (a
		// server setting), nothing of an automatic redelivery.
		Delivery: Delivery{
			Retry:   Retry{Source: Undocumented},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Duration: 5 * time.Second, Note: "the default of [webhook] DELIVER_TIMEOUT, set by the server's administrator", Source: "https://forgejo.org/docs/latest/admin/config-cheat-sheet/#webhook-webhook"},
			Answer:  Answer{Source: Undocumented},
			Refusal: Refusal{Source: Undocumented},
		},
		Doc:             "https://forgejo.org/docs/latest/user/webhooks/",
		SignatureHeader: "X-Forgejo-Signature: <hex>",
		EventID:         ids(headerID("X-Forgejo-Delivery")),
		DedupeBody:      true,
		// Forgejo sends the same HMAC under Gitea's names too (deliver.go).
		CredentialHeaders: []string{"X-Gitea-Signature", "X-Gogs-Signature", "X-Hub-Signature-256", "X-Hub-Signature"},
		build:             withFormPayload,
		covers:            formPayloadCovers,
		overridable:       true,
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "X-Forgejo-Signature"}},
			Signed:    "{body}",
			Algorithm: "sha256",
			Encoding:  "hex",
		},
	})
}
