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
		Name:               "okta",
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
	register(svixBased("clerk", "https://clerk.com/docs/webhooks/sync-data", "@clerk/backend"))
	// WorkOS: "t=<ms>, v1=<hex>" over "<t>.<body>"; its SDK allows 180 s.
	register(Preset{
		Name:             "workos",
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
			Retry:  Retry{Retries: true, Note: "each delivery carries Persona-Webhook-Attempts-Made, -Attempts-Left and -First-Attempted-At", Source: "https://docs.withpersona.com/api-reference/webhooks/webhooks-account-events/webhook-account-created"},
			Answer: Answer{Status: 200, Source: "https://docs.withpersona.com/api-reference/webhooks/webhooks-account-events/webhook-account-created"},
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
