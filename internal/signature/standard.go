package signature

import "time"

// Standard Webhooks (and Svix, which it grew out of): webhook-id,
// webhook-timestamp, webhook-signature: v1,<base64>[ v1,<base64>...], an
// HMAC-SHA256 of "<id>.<timestamp>.<body>" keyed with the base64 secret after
// its optional whsec_ prefix. Entries of other versions (v1a, Ed25519) and
// unparsable entries are skipped; a header with no usable v1 entry fails.
//
// Both presets accept both header families: standard prefers webhook-* and
// falls back to svix-*, svix the other way round (as svix-go does).
func init() {
	webhook := HeaderSet{Signature: "webhook-signature", Timestamp: "webhook-timestamp", ID: "webhook-id"}
	svix := HeaderSet{Signature: "svix-signature", Timestamp: "svix-timestamp", ID: "svix-id"}
	scheme := Scheme{
		Format:    Format{List: " ", Pair: ",", SigKey: "v1", Lenient: true},
		Signed:    "{id}.{timestamp}.{body}",
		Algorithm: "sha256",
		Encoding:  "base64",
		Secret:    "whsec",
	}

	standard := scheme
	standard.Headers = []HeaderSet{webhook, svix}
	register(Preset{
		Name: "standard",
		Delivery: Delivery{
			// The specification recommends rather than requires; a sender
			// following it retries for days.
			Retry: Retry{
				Retries: true, For: 75*time.Hour + 35*time.Minute + 5*time.Second, Attempts: 10,
				Note:   "recommended: exponential back-off over several days, as in the example schedule (at once, then after 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 14 h, 20 h, 24 h); an endpoint failing for long should be disabled",
				Source: "https://github.com/standard-webhooks/standard-webhooks/blob/main/spec/standard-webhooks.md#deliverability-and-reliability",
			},
			MaxBody: MaxBody{Note: "no limit; payloads are recommended to stay under 20 kB", Source: "https://github.com/standard-webhooks/standard-webhooks/blob/main/spec/standard-webhooks.md#payload-size"},
			Timeout: Timeout{Duration: 15 * time.Second, Note: "recommended between 15 and 30 s", Source: "https://github.com/standard-webhooks/standard-webhooks/blob/main/spec/standard-webhooks.md#request-timeouts"},
			Answer:  Answer{Note: "3xx is a failure (redirects not followed)", Source: "https://github.com/standard-webhooks/standard-webhooks/blob/main/spec/standard-webhooks.md#delivery-success-and-failure"},
			Refusal: Refusal{Note: "a failure like any non-2xx; 410 Gone disables the endpoint, 429, 502 and 504 throttle", Source: "https://github.com/standard-webhooks/standard-webhooks/blob/main/spec/standard-webhooks.md#delivery-success-and-failure"},
		},
		Doc:              "https://github.com/standard-webhooks/standard-webhooks/blob/main/spec/standard-webhooks.md",
		SignatureHeader:  "webhook-signature: v1,<base64> (with webhook-id, webhook-timestamp; svix-* accepted)",
		DefaultTolerance: 5 * time.Minute,
		EventID:          ids(headerID("webhook-id"), headerID("svix-id")),
		IDStability:      StabilityStable,
		Oracle:           "standardwebhooks",
		Scheme:           standard,
	})

	sv := scheme
	sv.Headers = []HeaderSet{svix, webhook}
	register(Preset{
		Name: "svix",
		Delivery: Delivery{
			Retry:   Retry{Retries: true, For: 27*time.Hour + 35*time.Minute + 5*time.Second, Attempts: 8, Note: "at once, then after 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h; webhook-delivery: abort-message stops them", Source: "https://docs.svix.com/retries"},
			Timeout: Timeout{Duration: 15 * time.Second, Source: "https://docs.svix.com/retries"},
			Answer:  Answer{Note: "3xx counts as a failure", Source: "https://docs.svix.com/retries"},
			MaxBody: MaxBody{Source: Undocumented},
			Refusal: Refusal{Source: Undocumented},
		},
		Doc:              "https://docs.svix.com/receiving/verifying-payloads/how-manual",
		SignatureHeader:  "svix-signature: v1,<base64> (with svix-id, svix-timestamp; webhook-* accepted)",
		DefaultTolerance: 5 * time.Minute,
		EventID:          ids(headerID("svix-id"), headerID("webhook-id")),
		IDStability:      StabilityStable,
		Oracle:           "svix",
		Scheme:           sv,
	})
}
