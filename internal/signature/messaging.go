package signature

import (
	"net/http"
	"time"
)

// Messaging, e-mail and streaming providers.
func init() {
	// Twitch EventSub: HMAC-SHA256 over message ID + timestamp (RFC 3339)
	// + body; Twitch asks receivers to refuse messages older than 10
	// minutes and documents that a retried notification keeps its message
	// ID. The callback verification is signed like a notification and
	// answered with the raw challenge as text; revocation messages are
	// ordinary deliveries.
	register(Preset{
		Name: "twitch",
		Delivery: Delivery{
			Retry: Retry{
				Retries: true,
				Note:    "at least once: an event Twitch is unsure was received is sent again",
				Source:  "https://dev.twitch.tv/docs/eventsub/#handling-duplicate-events",
			},
			Timeout: Timeout{
				Note:   "a few seconds (no figure); too many slow answers revoke the subscription (notification_failures_exceeded)",
				Source: "https://dev.twitch.tv/docs/eventsub/handling-webhook-events/",
			},
			Answer: Answer{Note: "answer before processing", Source: "https://dev.twitch.tv/docs/eventsub/handling-webhook-events/"},
			// The page's Node.js example answers 403 when the signatures
			// do not match; no text requires a status or says what Twitch
			// does with it.
			Refusal: Refusal{Note: "the documented example answers 403 to a signature mismatch", Source: "https://dev.twitch.tv/docs/eventsub/handling-webhook-events/#simple-nodejs-example"},
			MaxBody: MaxBody{Source: Undocumented},
		},
		Doc:              "https://dev.twitch.tv/docs/eventsub/handling-webhook-events/#verifying-the-event-message",
		SignatureHeader:  "Twitch-Eventsub-Message-Signature: sha256=<hex> (with Twitch-Eventsub-Message-Id, -Timestamp)",
		DefaultTolerance: 10 * time.Minute,
		EventID:          ids(headerID("Twitch-Eventsub-Message-Id")),
		IDStability:      StabilityStable,
		Challenges: []Challenge{{
			Name: "webhook_callback_verification", Method: http.MethodPost,
			Header: "Twitch-Eventsub-Message-Type", HeaderValue: "webhook_callback_verification",
			Auth: AuthSignature, Answer: AnswerText, Echo: "json challenge",
		}},
		Scheme: Scheme{
			Headers: []HeaderSet{{
				Signature: "Twitch-Eventsub-Message-Signature",
				Timestamp: "Twitch-Eventsub-Message-Timestamp",
				ID:        "Twitch-Eventsub-Message-Id",
			}},
			Format:          Format{Prefix: "sha256="},
			Signed:          "{id}{timestamp}{body}",
			Algorithm:       "sha256",
			Encoding:        "hex",
			TimestampLayout: time.RFC3339Nano,
		},
	})
	// Meta (WhatsApp Cloud API, Instagram, Messenger): X-Hub-Signature-256
	// over the body with the app secret. The subscription handshake is a
	// GET with hub.mode=subscribe, answered with hub.challenge when
	// hub.verify_token equals the route's verify token. Payloads batch
	// entries without a per-event ID: configure one (e.g. a message ID).
	register(Preset{
		Name: "meta",
		Delivery: Delivery{
			Retry: Retry{
				Retries: true, For: 36 * time.Hour,
				Note:   "a failed update is retried at once, then a few more times less and less often over 36 hours, then dropped; Messenger's schedule differs",
				Source: "https://developers.facebook.com/docs/graph-api/webhooks/getting-started",
			},
			MaxBody: MaxBody{Note: "a batch of at most 1000 updates (no byte figure)", Source: "https://developers.facebook.com/docs/graph-api/webhooks/getting-started"},
			Timeout: Timeout{Source: Undocumented},
			Answer:  Answer{Status: 200, Source: "https://developers.facebook.com/docs/graph-api/webhooks/getting-started"},
			// "Fails" is not defined beyond the answer 200 OK.
			Refusal: Refusal{Source: Undocumented},
		},
		Doc:             "https://developers.facebook.com/docs/graph-api/webhooks/getting-started",
		SignatureHeader: "X-Hub-Signature-256: sha256=<hex>",
		DedupeBody:      true,
		Challenges: []Challenge{{
			Name: "hub.challenge", Method: http.MethodGet, Query: "hub.mode", QueryValue: "subscribe",
			Auth: AuthVerifyToken, TokenQuery: "hub.verify_token",
			Answer: AnswerText, Echo: "query hub.challenge",
		}},
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "X-Hub-Signature-256"}},
			Format:    Format{Prefix: "sha256="},
			Signed:    "{body}",
			Algorithm: "sha256",
			Encoding:  "hex",
		},
	})
	// Microsoft Graph change notifications carry no signature: each
	// notification in value[] holds the clientState the subscription was
	// created with, configured here as the secret. The validation request
	// is a POST ?validationToken=… answered 200 text/plain with the token
	// within 10 s. Notifications have no per-event ID: configure one.
	register(Preset{
		Name: "msgraph",
		Delivery: Delivery{
			Retry: Retry{
				Retries: true, For: 4 * time.Hour,
				Note:   "any answer but a 2xx, given within 10 s, is retried with exponential back-off for up to 4 hours",
				Source: "https://learn.microsoft.com/en-us/graph/change-notifications-delivery-webhooks",
			},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{
				Duration: 10 * time.Second,
				Note:     "more than 10% of answers over 10 s in 10 minutes delay notifications; more than 15% drop them for up to 10 minutes, unrecoverably",
				Source:   "https://learn.microsoft.com/en-us/graph/change-notifications-delivery-webhooks",
			},
			Answer:  Answer{Note: "200 when handled within 3 s; 202 Accepted when queued for longer work", Source: "https://learn.microsoft.com/en-us/graph/change-notifications-delivery-webhooks"},
			Refusal: Refusal{Source: Undocumented},
		},
		Doc:             "https://learn.microsoft.com/en-us/graph/change-notifications-delivery-webhooks",
		SignatureHeader: "none: value[].clientState in the body",
		DedupeBody:      true,
		Challenges: []Challenge{{
			Name: "validationToken", Method: http.MethodPost, Query: "validationToken",
			Auth: AuthNone, Answer: AnswerText, Echo: "query validationToken",
		}},
		Scheme: Scheme{Signed: "none: every value[].clientState equals the secret"},
		build:  buildGraph,
	})
	// Telnyx: Ed25519 over "<timestamp>|<body>", verified with the account's
	// public key (base64, from the portal); telnyx-node allows 300 s.
	register(Preset{
		Name: "telnyx",
		Delivery: Delivery{
			Retry: Retry{
				Retries: true, Attempts: 3,
				Note:   "up to 3 attempts per URL when the answer is late, then the failover URL if one is configured",
				Source: "https://developers.telnyx.com/docs/messaging/messages/receiving-webhooks",
			},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Duration: 2 * time.Second, Source: "https://developers.telnyx.com/docs/messaging/messages/receiving-webhooks"},
			Answer:  Answer{Status: 200, Note: "the messaging guide asks for a 2xx within 2 seconds", Source: "https://developers.telnyx.com/api-reference/callbacks/number-order-status-update"},
			Refusal: Refusal{Note: "not 200: delivered to the failover URL, if any", Source: "https://developers.telnyx.com/api-reference/callbacks/number-order-status-update"},
		},
		SecretFormat:     "the public key (base64 Ed25519)",
		Doc:              "https://developers.telnyx.com/docs/messaging/messages/receiving-webhooks",
		SignatureHeader:  "telnyx-signature-ed25519: <base64> (with telnyx-timestamp)",
		DefaultTolerance: 5 * time.Minute,
		EventID:          ids(jsonID("data.id")),
		Oracle:           "telnyx",
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "telnyx-signature-ed25519", Timestamp: "telnyx-timestamp"}},
			Signed:    "{timestamp}|{body}",
			Algorithm: "ed25519",
			Encoding:  "base64",
		},
		build: buildPubkey(algEd25519, "|"),
	})
	// Customer.io reporting webhooks.
	register(Preset{
		Name: "customerio",
		Delivery: Delivery{
			Retry: Retry{
				Retries: true, For: 7 * 24 * time.Hour,
				Note:   "exponential back-off for seven days; later webhooks are held back until the failing one succeeds or expires",
				Source: "https://docs.customer.io/api/webhooks/",
			},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Duration: 4 * time.Second, Source: "https://docs.customer.io/api/webhooks/"},
			Answer:  Answer{Note: "any 2xx within 4 seconds", Source: "https://docs.customer.io/api/webhooks/"},
			Refusal: Refusal{Note: "400, 401, 403 and the like wait an hour before the same back-off; later webhooks are held back meanwhile", Source: "https://docs.customer.io/api/webhooks/"},
		},
		Doc:              "https://docs.customer.io/journeys/webhooks/#securely-verify-requests",
		SignatureHeader:  "X-CIO-Signature: <hex> (with X-CIO-Timestamp)",
		DefaultTolerance: 5 * time.Minute,
		EventID:          ids(jsonID("event_id")),
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "X-CIO-Signature", Timestamp: "X-CIO-Timestamp"}},
			Signed:    "v0:{timestamp}:{body}",
			Algorithm: "sha256",
			Encoding:  "hex",
		},
	})
	// Mailgun signs inside the JSON body, and only timestamp + token: see
	// bodysig.go. event-data.id names the event across retries.
	register(Preset{
		Name: "mailgun",
		Delivery: Delivery{
			Retry: Retry{
				Retries: true, For: 8 * time.Hour,
				Note:   "after 5, 10, 15 min, 1, 2 and 4 h; delivery notifications are not retried; a 406 answer stops the retries",
				Source: "https://documentation.mailgun.com/docs/mailgun/user-manual/webhooks/webhook-retries",
			},
			// The retries page and the user manual (mailgun/documentation)
			// give no size or timeout.
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Source: Undocumented},
			Answer:  Answer{Status: 200, Source: "https://documentation.mailgun.com/docs/mailgun/user-manual/webhooks/webhook-retries"},
			Refusal: Refusal{Note: "406 is taken as a rejection and not retried; any other refusal is retried for 8 hours", Source: "https://documentation.mailgun.com/docs/mailgun/user-manual/webhooks/webhook-retries"},
		},
		Doc:              "https://documentation.mailgun.com/docs/mailgun/user-manual/webhooks/securing-webhooks",
		SignatureHeader:  "none: body signature.signature = <hex> (with signature.timestamp, signature.token)",
		DefaultTolerance: 5 * time.Minute,
		EventID:          ids(jsonID("event-data.id")),
		IDStability:      StabilityStable,
		// Mailgun's documentation asks receivers to cache the token and
		// refuse a request whose token was used before: the only stop for
		// a signature pasted onto other event data within the tolerance.
		SingleUse: "json signature.token",
		Scheme: Scheme{
			Signed:    "body fields signature.timestamp + signature.token (event-data not signed)",
			Algorithm: "sha256",
			Encoding:  "hex",
		},
		build: buildMailgun,
	})
	// SendGrid Event Webhook: ECDSA P-256 over timestamp + body, verified
	// with the verification key SendGrid displays (base64 DER). The body is
	// an array of events, each with its own sg_event_id.
	register(Preset{
		Name: "sendgrid",
		Delivery: Delivery{
			Retry: Retry{
				Retries: true, For: 24 * time.Hour,
				Note:   "any answer but a 2xx is retried at increasing intervals for up to 24 hours after the event",
				Source: "https://docs.sendgrid.com/for-developers/tracking-events/troubleshooting",
			},
			MaxBody: MaxBody{
				Note:   "events are posted every 30 seconds or when the batch reaches 768 KB, whichever comes first (not a hard limit)",
				Source: "https://github.com/sendgrid/docs/blob/develop/content/docs/for-developers/tracking-events/getting-started-event-webhook.md#data-storage",
			},
			Timeout: Timeout{Source: Undocumented},
			Answer:  Answer{Note: "any 2xx", Source: "https://docs.sendgrid.com/for-developers/tracking-events/troubleshooting"},
			Refusal: Refusal{Note: "retried like any answer but a 2xx", Source: "https://docs.sendgrid.com/for-developers/tracking-events/troubleshooting"},
		},
		SecretFormat:     "the verification key (base64 DER ECDSA P-256)",
		Doc:              "https://www.twilio.com/docs/sendgrid/for-developers/tracking-events/getting-started-event-webhook-security-features",
		SignatureHeader:  "X-Twilio-Email-Event-Webhook-Signature: <base64 DER ECDSA> (with X-Twilio-Email-Event-Webhook-Timestamp)",
		DefaultTolerance: 5 * time.Minute,
		Oracle:           "@sendgrid/eventwebhook",
		Batch:            &Batch{Items: "@this", ItemID: "sg_event_id", Policy: BatchSet},
		Scheme: Scheme{
			Headers: []HeaderSet{{
				Signature: "X-Twilio-Email-Event-Webhook-Signature",
				Timestamp: "X-Twilio-Email-Event-Webhook-Timestamp",
			}},
			Signed:    "{timestamp}{body}",
			Algorithm: "ecdsa-p256",
			Encoding:  "base64",
		},
		build: buildPubkey(algECDSAP256, ""),
	})
	// Resend delivers through Svix.
	resend := svixBased("resend", "https://resend.com/docs/dashboard/webhooks/verify-webhooks-requests", "resend")
	resend.Delivery = Delivery{
		Retry: Retry{
			Retries: true, For: 27*time.Hour + 35*time.Minute + 5*time.Second, Attempts: 8,
			Note:   "at once, then after 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h; a removed or disabled endpoint stops them",
			Source: "https://resend.com/docs/webhooks/retries-and-replays",
		},
		MaxBody: MaxBody{Source: Undocumented},
		Timeout: Timeout{Source: Undocumented},
		Answer:  Answer{Status: 200, Note: "200 OK signals the delivery succeeded", Source: "https://resend.com/docs/webhooks/create-webhook"},
		Refusal: Refusal{Source: Undocumented},
	}
	register(resend)
}

// svixBased is a provider that delivers through Svix: the svix preset's
// scheme and event ID under the provider's name. Svix keeps svix-id across
// the retries of one message.
func svixBased(name, doc, oracle string) Preset {
	svix := HeaderSet{Signature: "svix-signature", Timestamp: "svix-timestamp", ID: "svix-id"}
	webhook := HeaderSet{Signature: "webhook-signature", Timestamp: "webhook-timestamp", ID: "webhook-id"}
	return Preset{
		Name:             name,
		Doc:              doc,
		SignatureHeader:  "svix-signature: v1,<base64> (with svix-id, svix-timestamp; webhook-* accepted)",
		DefaultTolerance: 5 * time.Minute,
		EventID:          ids(headerID("svix-id"), headerID("webhook-id")),
		IDStability:      StabilityStable,
		Oracle:           oracle,
		Scheme: Scheme{
			Headers:   []HeaderSet{svix, webhook},
			Format:    Format{List: " ", Pair: ",", SigKey: "v1", Lenient: true},
			Signed:    "{id}.{timestamp}.{body}",
			Algorithm: "sha256",
			Encoding:  "base64",
			Secret:    "whsec",
		},
	}
}

// standardBased is a provider that follows Standard Webhooks (webhook-*
// headers). secret is "whsec" when the provider displays whsec_<base64>
// secrets, "raw" when the HMAC key is the displayed string's bytes (Polar).
func standardBased(name, doc, secret, oracle string) Preset {
	p := svixBased(name, doc, oracle)
	p.SignatureHeader = "webhook-signature: v1,<base64> (with webhook-id, webhook-timestamp)"
	p.EventID = ids(headerID("webhook-id"))
	p.Headers = []HeaderSet{{Signature: "webhook-signature", Timestamp: "webhook-timestamp", ID: "webhook-id"}}
	p.Scheme.Secret = secret
	return p
}
