package signature

import (
	"crypto/sha256"
	"net/http"
	"time"
)

// Identity providers.
func init() {
	// Okta event hooks authenticate with a static secret in a header whose
	// name each hook chooses (Authorization unless configured otherwise:
	// `header` in the provider block). The one-time verification is a GET
	// with X-Okta-Verification-Challenge, answered {"verification": …}.
	// Events arrive in data.events[], each with its uuid.
	register(Preset{
		Name: "okta",
		Delivery: Delivery{
			Retry:   Retry{Retries: true, Attempts: 2, Note: "at most one retry; a 4xx answer is not retried; delivery is best effort, at least once", Source: "https://developer.okta.com/docs/concepts/event-hooks/#timeout-and-retry"},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Duration: 3 * time.Second, Source: "https://developer.okta.com/docs/concepts/event-hooks/#timeout-and-retry"},
			Answer:  Answer{Note: "Okta asks for 200 or 204 with an empty body, at once, before processing", Source: "https://developer.okta.com/docs/concepts/event-hooks/#your-service-s-responses-to-event-delivery-requests"},
			Refusal: Refusal{Note: "a 4xx is not retried: the events are lost to the receiver", Source: "https://developer.okta.com/docs/concepts/event-hooks/#timeout-and-retry"},
		},
		Doc:                "https://developer.okta.com/docs/concepts/event-hooks/",
		SignatureHeader:    "Authorization: <secret> (header name configurable)",
		EventID:            ids(jsonID("eventId")),
		DedupeBody:         true,
		HeaderConfigurable: true,
		Challenges: []Challenge{{
			Name: "verification", Method: http.MethodGet, Header: "X-Okta-Verification-Challenge",
			Auth: AuthNone, Answer: AnswerJSON, Echo: "header X-Okta-Verification-Challenge", JSONKey: "verification",
		}},
		Batch: &Batch{Items: "data.events", ItemID: "uuid", Policy: BatchSet},
		Scheme: Scheme{
			Headers: []HeaderSet{{Signature: "Authorization"}},
			Signed:  "none: the secret is sent as is",
		},
		build: func(p Preset, o Options) (signer, error) {
			header := p.Headers[0].Signature
			if o.HMAC.Header != "" {
				header = o.HMAC.Header
			}
			v := &tokenVerifier{header: header, first: o.Secrets[0]}
			for _, s := range o.Secrets {
				d := sha256.Sum256([]byte(s))
				v.digests = append(v.digests, d[:])
			}
			return v, nil
		},
	})
	// Clerk delivers through Svix.
	clerk := svixBased("clerk", "https://clerk.com/docs/webhooks/sync-data", "@clerk/backend")
	clerk.Delivery = Delivery{
		// Clerk's overview defers to Svix's schedule (its Retry section
		// links https://docs.svix.com/retries), the svix preset's facts.
		Retry: Retry{
			Retries: true, For: 27*time.Hour + 35*time.Minute + 5*time.Second, Attempts: 8,
			Note:   "Svix's schedule: at once, then after 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h; an endpoint removed or disabled in the Clerk Dashboard stops them",
			Source: "https://clerk.com/docs/webhooks/overview#retry",
		},
		MaxBody: MaxBody{Source: Undocumented},
		Timeout: Timeout{Duration: 15 * time.Second, Note: "Svix's limit", Source: "https://docs.svix.com/retries"},
		Answer:  Answer{Note: "3xx counts as a failure (Svix)", Source: "https://docs.svix.com/retries"},
		Refusal: Refusal{Source: Undocumented},
	}
	register(clerk)
	// WorkOS: "t=<ms>, v1=<hex>" over "<t>.<body>"; its SDK allows 180 s.
	register(Preset{
		Name: "workos",
		Delivery: Delivery{
			Retry: Retry{
				Retries: true, For: 3 * 24 * time.Hour,
				Note:   "anything but a 2xx is retried with exponential back-off for up to 3 days in production; other environments retry for several minutes",
				Source: "https://workos.com/docs/webhooks",
			},
			MaxBody: MaxBody{Source: Undocumented},
			// Slow answers "may cause requests to timeout": no figure.
			Timeout: Timeout{Source: Undocumented},
			Answer:  Answer{Note: "200 OK as quickly as possible, processing afterwards", Source: "https://workos.com/docs/webhooks"},
			Refusal: Refusal{Source: Undocumented},
		},
		Doc:              "https://workos.com/docs/events/data-syncing/webhooks",
		SignatureHeader:  "WorkOS-Signature: t=<ms>, v1=<hex>",
		Oracle:           "@workos-inc/node",
		DefaultTolerance: 3 * time.Minute,
		EventID:          ids(jsonID("id")),
		Scheme: Scheme{
			Headers:       []HeaderSet{{Signature: "WorkOS-Signature"}},
			Format:        Format{List: ",", Pair: "=", SigKey: "v1", TimestampKey: "t"},
			Signed:        "{timestamp}.{body}",
			Algorithm:     "sha256",
			Encoding:      "hex",
			TimestampUnit: time.Millisecond,
		},
	})
	// Persona: "t=<ts>,v1=<hex>" over "<t>.<body>".
	register(Preset{
		Name: "persona",
		Delivery: Delivery{
			Retry: Retry{
				Retries: true, For: 258 * time.Second, Attempts: 5,
				Note:   "exponential back-off: attempts at 0, 3, 18, 83 and 258 s; each carries Persona-Webhook-Attempts-Made, -Attempts-Left and -First-Attempted-At",
				Source: "https://docs.withpersona.com/docs/best-practices",
			},
			Answer:  Answer{Status: 200, Source: "https://docs.withpersona.com/api-reference/webhooks/webhooks-account-events/webhook-account-created"},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Source: Undocumented},
			Refusal: Refusal{Source: Undocumented},
		},
		Doc:              "https://docs.withpersona.com/docs/webhooks-best-practices#checking-signatures",
		SignatureHeader:  "Persona-Signature: t=<ts>,v1=<hex>",
		DefaultTolerance: 5 * time.Minute,
		EventID:          ids(jsonID("data.id")),
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "Persona-Signature"}},
			Format:    Format{List: ",", Pair: "=", SigKey: "v1", TimestampKey: "t"},
			Signed:    "{timestamp}.{body}",
			Algorithm: "sha256",
			Encoding:  "hex",
		},
	})
}
