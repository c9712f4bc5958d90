package signature

import (
	"net/http"
	"time"
)

// Productivity, file and scheduling platforms.
func init() {
	// Asana: the first POST of a new webhook carries X-Hook-Secret, echoed
	// back in the answer's header; that value becomes the secret of
	// X-Hook-Signature on every later delivery (learned, not configured).
	// Heartbeats are signed deliveries with an empty events array. Events
	// carry no ID: configure one.
	register(Preset{
		Name: "asana",
		Delivery: Delivery{
			Retry: Retry{
				Retries: true, For: 24 * time.Hour,
				Note:   "resent for up to 24 hours; the system is at-most-once, so an event can still be lost",
				Source: "https://developers.asana.com/docs/webhooks-guide",
			},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Duration: 10 * time.Second, Source: "https://developers.asana.com/docs/webhooks-guide"},
			Answer:  Answer{Note: "a successful status within 10 seconds", Source: "https://developers.asana.com/docs/webhooks-guide"},
			Refusal: Refusal{Source: Undocumented},
		},
		Doc:             "https://developers.asana.com/docs/webhooks-guide",
		SignatureHeader: "X-Hook-Signature: <hex> (secret learned from X-Hook-Secret)",
		DedupeBody:      true,
		Challenges: []Challenge{
			{ //nolint:gosec // G101: header names, not credentials
				Name: "X-Hook-Secret", Method: http.MethodPost, Header: "X-Hook-Secret",
				Auth: AuthNone, Answer: AnswerHeader, Echo: "header X-Hook-Secret", EchoHeader: "X-Hook-Secret",
				LearnSecret: "header X-Hook-Secret",
			},
			{
				Name: "heartbeat", Method: http.MethodPost, BodyField: "events.#", BodyValue: "0",
				Auth: AuthSignature, Answer: AnswerEmpty,
			},
		},
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "X-Hook-Signature"}},
			Signed:    "{body}",
			Algorithm: "sha256",
			Encoding:  "hex",
		},
	})
	// Trello: base64 HMAC-SHA1 (app secret) over the body followed by the
	// callback URL as registered. A HEAD probe precedes registration.
	register(Preset{
		Name:            "trello",
		Doc:             "https://developer.atlassian.com/cloud/trello/guides/rest-api/webhooks/#webhook-signatures",
		SignatureHeader: "X-Trello-Webhook: <base64>",
		EventID:         ids(jsonID("action.id")),
		NeedsURL:        true,
		Challenges: []Challenge{{
			Name: "HEAD probe", Method: http.MethodHead, Auth: AuthNone, Answer: AnswerEmpty,
		}},
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "X-Trello-Webhook"}},
			Signed:    "{body}{url}",
			Algorithm: "sha1",
			Encoding:  "base64",
		},
	})
	// Dropbox: the notification only names accounts with changes: there
	// is no event ID; configure one or rely on dedupe_body.
	register(Preset{
		Name: "dropbox",
		Delivery: Delivery{
			Retry: Retry{
				Retries: true, For: 10 * time.Minute,
				Note:   "a non-200 answer or a timeout is retried with exponential back-off for about ten minutes, then reported in the App Console",
				Source: "https://www.dropbox.com/developers/webhooks/docs",
			},
			MaxBody: MaxBody{Source: Undocumented},
			// Ten seconds is stated for the verification request only.
			Timeout: Timeout{Source: Undocumented},
			Answer:  Answer{Status: 200, Source: "https://www.dropbox.com/developers/webhooks/docs"},
			Refusal: Refusal{Note: "a non-200 answer is retried like any failure", Source: "https://www.dropbox.com/developers/webhooks/docs"},
		},
		Doc:             "https://www.dropbox.com/developers/reference/webhooks",
		SignatureHeader: "X-Dropbox-Signature: <hex>",
		DedupeBody:      true,
		Challenges: []Challenge{{
			Name: "challenge", Method: http.MethodGet, Query: "challenge",
			Auth: AuthNone, Answer: AnswerText, Echo: "query challenge", NoSniff: true,
		}},
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "X-Dropbox-Signature"}},
			Signed:    "{body}",
			Algorithm: "sha256",
			Encoding:  "hex",
		},
	})
	// Notion: the subscription's first POST carries verification_token,
	// which the user confirms in Notion and which then signs every event.
	register(Preset{
		Name: "notion",
		Delivery: Delivery{
			// Each event carries attempt_number, 1 to 8.
			Retry: Retry{
				Retries: true, For: 24 * time.Hour,
				Note:   "an event not acknowledged is retried up to 8 times with exponential back-off, the last about 24 hours after the event",
				Source: "https://developers.notion.com/reference/webhooks-events-delivery#delivery-retries",
			},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Source: Undocumented},
			Answer:  Answer{Source: Undocumented},
			Refusal: Refusal{Source: Undocumented},
		},
		Doc:             "https://developers.notion.com/reference/webhooks",
		SignatureHeader: "X-Notion-Signature: sha256=<hex>",
		EventID:         ids(jsonID("id")),
		Challenges: []Challenge{{ //nolint:gosec // G101: a field name, not a credential
			Name: "verification_token", Method: http.MethodPost, BodyField: "verification_token",
			Auth: AuthNone, Answer: AnswerEmpty, LearnSecret: "json verification_token",
		}},
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "X-Notion-Signature"}},
			Format:    Format{Prefix: "sha256="},
			Signed:    "{body}",
			Algorithm: "sha256",
			Encoding:  "hex",
		},
	})
	// Box V2 webhooks: base64 HMAC-SHA256 over body + BOX-DELIVERY-TIMESTAMP
	// (RFC 3339), refused after 10 minutes as Box's SDKs do. Only the
	// primary signature header is read: list both the primary and the
	// secondary key as secrets while rotating. As Box's SDKs, a body with
	// non-ASCII characters or "/" is also checked in Box's escaped form
	// (box.go).
	register(Preset{
		Name: "box",
		Delivery: Delivery{
			Retry: Retry{
				Retries: true, For: 2 * time.Hour, Attempts: 13,
				Note:   "up to 12 retries over 2 hours (the page says these may change); a retried payload keeps the body id, gets a new BOX-DELIVERY-ID",
				Source: "https://developer.box.com/guides/webhooks/v2/",
			},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Duration: 30 * time.Second, Source: "https://developer.box.com/guides/webhooks/v2/"},
			Answer:  Answer{Note: "a status in 200-299 within 30 seconds", Source: "https://developer.box.com/guides/webhooks/v2/"},
			Refusal: Refusal{Note: "any status outside 200-299 fails the delivery and is retried", Source: "https://developer.box.com/guides/webhooks/v2/"},
		},
		Doc:               "https://developer.box.com/guides/webhooks/v2/signatures-v2/",
		SignatureHeader:   "BOX-SIGNATURE-PRIMARY: <base64> (with BOX-DELIVERY-TIMESTAMP)",
		DefaultTolerance:  10 * time.Minute,
		EventID:           ids(jsonID("id")),
		Oracle:            "box-node-sdk",
		CredentialHeaders: []string{boxSecondary},
		Scheme: Scheme{
			Headers:         []HeaderSet{{Signature: "BOX-SIGNATURE-PRIMARY", Timestamp: "BOX-DELIVERY-TIMESTAMP"}},
			Signed:          "{body}{timestamp}",
			Algorithm:       "sha256",
			Encoding:        "base64",
			TimestampLayout: time.RFC3339Nano,
		},
		build: buildBox,
	})
	// Calendly: "t=<ts>,v1=<hex>" over "<t>.<body>"; its guide uses a
	// three-minute tolerance. Payloads carry no event ID: configure one.
	register(Preset{
		Name: "calendly",
		Delivery: Delivery{
			Retry: Retry{
				Retries: true, For: 24 * time.Hour,
				Note:   "a 3xx, 4xx or 5xx answer is retried with exponential back-off for 24 hours (or until 24 hours after the booked event); the webhook is then disabled",
				Source: "https://developer.calendly.com/api-docs/overview/webhooks/webhook-errors",
			},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Duration: 15 * time.Second, Note: "read timeout; 10 s to connect", Source: "https://developer.calendly.com/api-docs/overview/webhooks/webhook-timeouts"},
			Answer:  Answer{Note: "a 2xx, promptly", Source: "https://developer.calendly.com/api-docs/overview/webhooks/webhook-errors"},
			Refusal: Refusal{Note: "retried like any error answer, and counts towards disabling the webhook", Source: "https://developer.calendly.com/api-docs/overview/webhooks/webhook-errors"},
		},
		Doc:              "https://developer.calendly.com/api-docs/4c305798a61d3-webhook-signatures",
		SignatureHeader:  "Calendly-Webhook-Signature: t=<ts>,v1=<hex>",
		DefaultTolerance: 3 * time.Minute,
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "Calendly-Webhook-Signature"}},
			Format:    Format{List: ",", Pair: "=", SigKey: "v1", TimestampKey: "t"},
			Signed:    "{timestamp}.{body}",
			Algorithm: "sha256",
			Encoding:  "hex",
		},
	})
	register(Preset{
		Name: "calcom",
		// Cal.com's webhook pages state none of the delivery facts.
		Delivery:        allUndocumented,
		Doc:             "https://cal.com/docs/developing/guides/automation/webhooks",
		SignatureHeader: "X-Cal-Signature-256: <hex>",
		DedupeBody:      true,
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "X-Cal-Signature-256"}},
			Signed:    "{body}",
			Algorithm: "sha256",
			Encoding:  "hex",
		},
	})
	// DocuSign Connect: one X-DocuSign-Signature-<n> per HMAC key; the
	// first is read, so list every key as a secret. No event ID of its
	// own: configure one (e.g. data.envelopeId with generatedDateTime).
	register(Preset{
		Name: "docusign",
		Delivery: Delivery{
			// Redelivery depends on the configuration's
			// requiresAcknowledgement, which the gateway cannot see: record
			// the default (no retry) so the spool stays on.
			Retry: Retry{
				Note:   "without requiresAcknowledgement a message not acknowledged within 100 s is not retried; with it a failed message is queued and retried after at least a day, at most 10 times",
				Source: "https://developers.docusign.com/docs/esign-rest-api/reference/connect/connectconfigurations/create/",
			},
			Timeout: Timeout{Duration: 100 * time.Second, Source: "https://developers.docusign.com/docs/esign-rest-api/reference/connect/connectconfigurations/create/"},
			Answer:  Answer{Note: "a status in 200-299; DocuSign awaits a 200", Source: "https://developers.docusign.com/docs/esign-rest-api/reference/connect/connectconfigurations/create/"},
			// Only a lower bound is stated (for messages that carry the
			// envelope's PDFs), so max_body keeps the gateway's default.
			MaxBody: MaxBody{
				Note:   "no maximum stated; a message that includes the envelope's documents can be 25 MB or larger",
				Source: "https://github.com/docusign/OpenAPI-Specifications/blob/master/esignature.rest.swagger-v2.json",
			},
			Refusal: Refusal{
				Note:   "a status outside 200-299 is a failed delivery: queued and retried only with requiresAcknowledgement",
				Source: "https://developers.docusign.com/docs/esign-rest-api/reference/connect/connectconfigurations/create/",
			},
		},
		Doc:             "https://developers.docusign.com/platform/webhooks/connect/hmac/",
		SignatureHeader: "X-DocuSign-Signature-1: <base64>",
		DedupeBody:      true,
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "X-DocuSign-Signature-1"}},
			Signed:    "{body}",
			Algorithm: "sha256",
			Encoding:  "base64",
		},
	})
	// Webflow: HMAC-SHA256 of "<timestamp ms>:<body>", five minutes.
	register(Preset{
		Name: "webflow",
		Delivery: Delivery{
			Retry: Retry{
				Retries: true, Attempts: 4,
				Note:   "up to three more attempts, 10 minutes apart; redirects, TLS failures and slow answers count as failures; repeated failures deactivate the webhook",
				Source: "https://developers.webflow.com/data/v1.0.0/docs/limits-and-retries",
			},
			MaxBody: MaxBody{Source: Undocumented},
			// "Prolonged delays" fail the delivery; no figure is given.
			Timeout: Timeout{Source: Undocumented},
			Answer:  Answer{Status: 200, Note: "anything but a valid 200 is a failure", Source: "https://developers.webflow.com/data/reference/error-handling"},
			Refusal: Refusal{Note: "retried like any failure; repeated failures deactivate the webhook", Source: "https://developers.webflow.com/data/reference/error-handling"},
		},
		Doc:              "https://developers.webflow.com/data/docs/working-with-webhooks#validating-request-signatures",
		SignatureHeader:  "x-webflow-signature: <hex> (with x-webflow-timestamp, ms)",
		Oracle:           "webflow-api",
		DefaultTolerance: 5 * time.Minute,
		Scheme: Scheme{
			Headers:       []HeaderSet{{Signature: "x-webflow-signature", Timestamp: "x-webflow-timestamp"}},
			Signed:        "{timestamp}:{body}",
			Algorithm:     "sha256",
			Encoding:      "hex",
			TimestampUnit: time.Millisecond,
		},
	})
}
