package signature

import (
	"net/http"
	"time"
)

// Software-as-a-service providers. Each is data for the generic engine,
// checked against the provider's documentation; no conformance vectors yet.
func init() {
	// Linear signs the body and puts webhookTimestamp (Unix ms) inside it;
	// its SDK (LinearWebhookClient) refuses a timestamp more than 60 s from
	// the clock, and so does this preset, after the signature matched.
	register(Preset{
		Name: "linear",
		Delivery: Delivery{
			Retry: Retry{
				Retries: true, For: 6 * time.Hour, Attempts: 4,
				Note:   "at most 3 retries: after 1 minute, 1 hour and 6 hours",
				Source: "https://developers.linear.app/docs/graphql/webhooks",
			},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Duration: 5 * time.Second, Source: "https://developers.linear.app/docs/graphql/webhooks"},
			Answer:  Answer{Status: 200, Source: "https://developers.linear.app/docs/graphql/webhooks"},
			Refusal: Refusal{Note: "a non-200 answer is retried like any failure", Source: "https://developers.linear.app/docs/graphql/webhooks"},
		},
		Doc:              "https://linear.app/developers/webhooks#securing-webhooks",
		SignatureHeader:  "Linear-Signature: <hex> (webhookTimestamp, ms, in the signed body)",
		DefaultTolerance: time.Minute,
		EventID:          ids(headerID("Linear-Delivery")),
		Oracle:           "@linear/sdk",
		Scheme: Scheme{
			Headers:       []HeaderSet{{Signature: "Linear-Signature"}},
			Signed:        "{body}",
			Algorithm:     "sha256",
			Encoding:      "hex",
			TimestampUnit: time.Millisecond,
		},
		build:       withBodyTimestamp("webhookTimestamp"),
		overridable: true,
	})
	// Zoom has no per-event ID; configure one (e.g. a composite) per route.
	register(Preset{
		Name: "zoom",
		Delivery: Delivery{
			Retry: Retry{
				Retries: true, For: 85 * time.Minute, Attempts: 4,
				Note:   "3 retries: 5 min after the first attempt, then 20 min and 60 min after the previous one",
				Source: "https://developers.zoom.us/blog/webhook-delays/",
			},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Duration: 3 * time.Second, Source: "https://developers.zoom.us/blog/webhook-delays/"},
			Answer:  Answer{Note: "200 or 204 within 3 seconds", Source: "https://developers.zoom.us/blog/webhook-delays/"},
			Refusal: Refusal{Source: Undocumented},
		},
		Doc:              "https://developers.zoom.us/docs/api/webhooks/#verify-webhook-events",
		SignatureHeader:  "x-zm-signature: v0=<hex> (with x-zm-request-timestamp)",
		DefaultTolerance: 5 * time.Minute,
		Challenges: []Challenge{{
			Name: "endpoint.url_validation", Method: http.MethodPost,
			BodyField: "event", BodyValue: "endpoint.url_validation",
			Auth: AuthSignature, Answer: AnswerZoom, Echo: "json payload.plainToken",
		}},
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "x-zm-signature", Timestamp: "x-zm-request-timestamp"}},
			Format:    Format{Prefix: "v0="},
			Signed:    "v0:{timestamp}:{body}",
			Algorithm: "sha256",
			Encoding:  "hex",
		},
	})
	register(Preset{
		Name: "typeform",
		Delivery: Delivery{
			Retry: Retry{
				Retries: true, For: 10 * time.Hour,
				Note:   "404 or 410 disables the webhook at once; 429, 408, 503 and 423 are retried every 2-3 minutes for 10 hours; other failures on a back-off schedule",
				Source: "https://typeform.com/developers/webhooks",
			},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Duration: 30 * time.Second, Note: "a slower answer is a failed delivery and is retried", Source: "https://typeform.com/developers/webhooks"},
			Answer:  Answer{Note: "any 2xx", Source: "https://typeform.com/developers/webhooks"},
			Refusal: Refusal{Note: "never 404 or 410: either disables the webhook", Source: "https://typeform.com/developers/webhooks"},
		},
		Doc:             "https://www.typeform.com/developers/webhooks/secure-your-webhooks/",
		SignatureHeader: "Typeform-Signature: sha256=<base64>",
		EventID:         ids(jsonID("event_id")),
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "Typeform-Signature"}},
			Format:    Format{Prefix: "sha256="},
			Signed:    "{body}",
			Algorithm: "sha256",
			Encoding:  "base64",
		},
	})
	// HubSpot v3 signs method + URI + body + timestamp (milliseconds). The
	// URL must be configured as HubSpot signs it (HubSpot decodes a few
	// percent-escapes such as %3A and %2F in it). Bodies are batches of
	// events, so there is no single default event ID.
	register(Preset{
		Name: "hubspot",
		Delivery: Delivery{
			Retry: Retry{
				Retries: true, For: 24 * time.Hour, Attempts: 11,
				Note:   "a failed connection, an answer later than 5 s or any 4xx or 5xx is retried up to 10 times, spread at random over the next 24 hours",
				Source: "https://developers.hubspot.com/docs/api/webhooks#retries",
			},
			MaxBody: MaxBody{Note: "up to 100 events a request (no size stated)", Source: "https://developers.hubspot.com/docs/api/webhooks#webhook-settings"},
			Timeout: Timeout{Duration: 5 * time.Second, Source: "https://developers.hubspot.com/docs/api/webhooks#retries"},
			Answer:  Answer{Note: "within 5 s, neither 4xx nor 5xx", Source: "https://developers.hubspot.com/docs/api/webhooks#retries"},
			Refusal: Refusal{Note: "a 4xx is retried like any failure", Source: "https://developers.hubspot.com/docs/api/webhooks#retries"},
		},
		Doc:              "https://developers.hubspot.com/docs/apps/developer-platform/build-apps/authentication/request-validation",
		SignatureHeader:  "X-HubSpot-Signature-v3: <base64> (with X-HubSpot-Request-Timestamp, ms)",
		DefaultTolerance: 5 * time.Minute,
		NeedsURL:         true,
		Oracle:           "@hubspot/api-client",
		Batch:            &Batch{Items: "@this", ItemID: "eventId", Policy: BatchSet},
		Scheme: Scheme{
			Headers:       []HeaderSet{{Signature: "X-HubSpot-Signature-v3", Timestamp: "X-HubSpot-Request-Timestamp"}},
			Signed:        "{method}{url}{body}{timestamp}",
			Algorithm:     "sha256",
			Encoding:      "base64",
			TimestampUnit: time.Millisecond,
		},
	})
	register(Preset{
		Name: "intercom",
		Delivery: Delivery{
			Retry: Retry{
				Retries: true,
				Note:    "a notification without a 200 within 5000 ms is sent again (how often is not stated); a 429 delays the next ones from 1 minute up to 2 hours, then they are dropped",
				Source:  "https://developers.intercom.com/docs/webhooks/webhook-notifications#duplicate-notifications",
			},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Duration: 5 * time.Second, Note: "answers within 500 ms keep their notifications' priority", Source: "https://developers.intercom.com/docs/webhooks/webhook-notifications#duplicate-notifications"},
			Answer:  Answer{Status: 200, Note: "answer at once, before any long-running task", Source: "https://developers.intercom.com/docs/webhooks/webhook-notifications#duplicate-notifications"},
			Refusal: Refusal{
				Note:   "error answers count: over 1000 in a row within 15 minutes pause the topic for 15 minutes; errors for more than 7 days suspend a private app's subscription",
				Source: "https://developers.intercom.com/docs/webhooks/webhook-notifications#suspended-subscriptions",
			},
		},
		Doc:             "https://developers.intercom.com/docs/webhooks/webhook-notifications#signed-notifications",
		SignatureHeader: "X-Hub-Signature: sha1=<hex>",
		EventID:         ids(jsonID("id")),
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "X-Hub-Signature"}},
			Format:    Format{Prefix: "sha1="},
			Signed:    "{body}",
			Algorithm: "sha1",
			Encoding:  "hex",
		},
	})
	// PagerDuty sends one v1 entry per active secret.
	register(Preset{
		Name: "pagerduty",
		Delivery: Delivery{
			Retry: Retry{
				Retries: true, For: 48 * time.Hour,
				Note:   "no answer in time, a 5xx, a 429 or a connection error is retried periodically for 48 hours; later webhooks for the same resource wait behind it",
				Source: "https://github.com/PagerDuty/developer-docs/blob/main/docs/webhooks/02-Behavior.md#temporary-errors-and-retries",
			},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Duration: 5 * time.Second, Note: "16 s for Custom Incident Actions", Source: "https://github.com/PagerDuty/developer-docs/blob/main/docs/webhooks/02-Behavior.md#timeouts"},
			Answer:  Answer{Note: "a 2xx within 5 seconds", Source: "https://github.com/PagerDuty/developer-docs/blob/main/docs/webhooks/02-Behavior.md#timeouts"},
			Refusal: Refusal{
				Note:   "a 4xx other than 429 drops the webhook without retry; 3 dropped in a row disable the subscription for 24 hours",
				Source: "https://github.com/PagerDuty/developer-docs/blob/main/docs/webhooks/02-Behavior.md#permanent-errors",
			},
		},
		Doc:             "https://developer.pagerduty.com/docs/webhooks/webhook-signatures/",
		SignatureHeader: "X-PagerDuty-Signature: v1=<hex>[,v1=<hex>]",
		EventID:         ids(jsonID("event.id")),
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "X-PagerDuty-Signature"}},
			Format:    Format{List: ",", Pair: "=", SigKey: "v1"},
			Signed:    "{body}",
			Algorithm: "sha256",
			Encoding:  "hex",
		},
	})
	// Sentry-Hook-Timestamp is sent but not signed, so it is not checked.
	register(Preset{
		Name: "sentry",
		Delivery: Delivery{
			Timeout: Timeout{
				Duration: time.Second,
				Note:     "1000 timeouts within 24 hours unsubscribe the webhook (not for published partner integrations)",
				Source:   "https://sentry.io/changelog/2023-10-3-change-to-integration-platform-webhook-handling",
			},
			Retry:   Retry{Source: Undocumented},
			MaxBody: MaxBody{Source: Undocumented},
			Answer:  Answer{Note: "within 1 second, else a timeout", Source: "https://docs.sentry.io/organization/integrations/integration-platform/webhooks/#response"},
			Refusal: Refusal{Source: Undocumented},
		},
		Doc:             "https://docs.sentry.io/integrations/integration-platform/webhooks/",
		SignatureHeader: "Sentry-Hook-Signature: <hex>",
		EventID:         ids(headerID("Request-ID")),
		DedupeBody:      true,
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "Sentry-Hook-Signature"}},
			Signed:    "{body}",
			Algorithm: "sha256",
			Encoding:  "hex",
		},
	})
}
