package signature

import "time"

// Developer platforms: hosting, CI, AI and blockchain APIs.
func init() {
	register(Preset{
		Name: "vercel",
		Delivery: Delivery{
			Retry: Retry{
				Retries: true, For: 24 * time.Hour,
				Note:   "anything but a 2xx is tried again with exponential back-off for up to 24 hours, then discarded",
				Source: "https://vercel.com/docs/webhooks/webhooks-api#delivery-attempts-and-retries",
			},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Duration: 30 * time.Second, Source: "https://vercel.com/docs/webhooks/webhooks-api#http-response"},
			Answer:  Answer{Note: "a 2xx; schedule the work, answer at once", Source: "https://vercel.com/docs/webhooks/webhooks-api#http-response"},
			Refusal: Refusal{Source: Undocumented},
		},
		Doc:             "https://vercel.com/docs/webhooks/webhooks-api#securing-webhooks",
		SignatureHeader: "x-vercel-signature: <hex>",
		EventID:         ids(jsonID("id")),
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "x-vercel-signature"}},
			Signed:    "{body}",
			Algorithm: "sha1",
			Encoding:  "hex",
		},
	})
	// Heroku app webhooks tell the event (webhook_metadata.event.id) from
	// the delivery and the attempt; the event's ID is the key.
	register(Preset{
		Name: "heroku",
		Delivery: Delivery{
			Retry: Retry{
				Retries: true, For: 72 * time.Hour,
				Note:   "subscriptions of level sync (level notify makes one attempt); once a webhook has failed for 72 hours, older events get one attempt",
				Source: "https://devcenter.heroku.com/changelog-items/2525",
			},
		},
		Doc:             "https://devcenter.heroku.com/articles/app-webhooks#securing-webhook-requests",
		SignatureHeader: "Heroku-Webhook-Hmac-SHA256: <base64>",
		EventID:         ids(jsonID("webhook_metadata.event.id"), jsonID("id")),
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "Heroku-Webhook-Hmac-SHA256"}},
			Signed:    "{body}",
			Algorithm: "sha256",
			Encoding:  "base64",
		},
	})
	register(Preset{
		Name: "circleci",
		Delivery: Delivery{
			Retry: Retry{
				Retries: true,
				Note:    "a non-2xx answer, or none within 10 s, is retried later (no schedule given); a request may come twice",
				Source:  "https://circleci.com/docs/guides/integration/outbound-webhooks/#communication-protocol",
			},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Duration: 10 * time.Second, Note: "the period \"currently\" used", Source: "https://circleci.com/docs/guides/integration/outbound-webhooks/#communication-protocol"},
			Answer:  Answer{Note: "within 10 seconds", Source: "https://circleci.com/docs/guides/integration/outbound-webhooks/#communication-protocol"},
			Refusal: Refusal{Note: "retried like any non-2xx", Source: "https://circleci.com/docs/guides/integration/outbound-webhooks/#communication-protocol"},
		},
		Doc:             "https://circleci.com/docs/webhooks/#validate-webhooks",
		SignatureHeader: "circleci-signature: v1=<hex>[,v1=<hex>]",
		EventID:         ids(jsonID("id")),
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "circleci-signature"}},
			Format:    Format{List: ",", Pair: "=", SigKey: "v1"},
			Signed:    "{body}",
			Algorithm: "sha256",
			Encoding:  "hex",
		},
	})
	// Buildkite payloads carry no event ID: configure one.
	// Buildkite's webhook pages (buildkite/docs, pages/apis/webhooks)
	// state no redelivery, size, timeout or expected answer.
	register(Preset{
		Name:             "buildkite",
		Delivery:         allUndocumented,
		Doc:              "https://buildkite.com/docs/apis/webhooks#webhook-signature",
		SignatureHeader:  "X-Buildkite-Signature: timestamp=<ts>,signature=<hex>",
		DefaultTolerance: 5 * time.Minute,
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "X-Buildkite-Signature"}},
			Format:    Format{List: ",", Pair: "=", SigKey: "signature", TimestampKey: "timestamp"},
			Signed:    "{timestamp}.{body}",
			Algorithm: "sha256",
			Encoding:  "hex",
		},
	})
	replicate := standardBased("replicate", "https://replicate.com/docs/topics/webhooks/verify-webhook", "whsec", "replicate")
	replicate.Delivery = Delivery{
		Retry: Retry{
			Retries: true,
			Note:    "only the final webhook (succeeded, failed, canceled) is retried, on exponential back-off, the last about 1 minute after the prediction completed; intermediate ones are not",
			Source:  "https://replicate.com/docs/topics/webhooks/receive-webhook",
		},
		MaxBody: MaxBody{Source: Undocumented},
		Timeout: Timeout{Note: "a few seconds (no figure)", Source: "https://replicate.com/docs/topics/webhooks/receive-webhook"},
		Answer:  Answer{Note: "a 2xx within a few seconds", Source: "https://replicate.com/docs/topics/webhooks/receive-webhook"},
		Refusal: Refusal{Note: "a 4xx to the final webhook is retried like a 5xx", Source: "https://replicate.com/docs/topics/webhooks/receive-webhook"},
	}
	register(replicate)
	openai := standardBased("openai", "https://platform.openai.com/docs/guides/webhooks", "whsec", "openai")
	openai.Delivery = Delivery{
		Retry: Retry{
			Retries: true, For: 72 * time.Hour,
			Note:   "a non-2xx answer, a redirect (not followed) or none within a few seconds is retried with exponential back-off for up to 72 hours; a rare duplicate keeps its webhook-id",
			Source: "https://platform.openai.com/docs/guides/webhooks",
		},
		MaxBody: MaxBody{Source: Undocumented},
		Timeout: Timeout{Note: "a few seconds (no figure)", Source: "https://platform.openai.com/docs/guides/webhooks"},
		Answer:  Answer{Note: "quickly; a 3xx is a failure, not followed", Source: "https://platform.openai.com/docs/guides/webhooks"},
		Refusal: Refusal{Note: "retried like any non-2xx", Source: "https://platform.openai.com/docs/guides/webhooks"},
	}
	register(openai)
	// Polar follows Standard Webhooks but keys the HMAC with the bytes of
	// the secret as displayed (its SDK base64-encodes it before handing it
	// to the standardwebhooks library, in validateEvent).
	polar := standardBased("polar", "https://docs.polar.sh/integrate/webhooks/delivery", "raw", "@polar-sh/sdk")
	polar.Delivery = Delivery{
		Retry: Retry{
			Retries: true, Attempts: 11,
			Note:   "up to 10 retries with exponential back-off; 10 consecutive failed deliveries disable the endpoint",
			Source: "https://docs.polar.sh/integrate/webhooks/delivery#delivery-retries",
		},
		MaxBody: MaxBody{Source: Undocumented},
		Timeout: Timeout{Duration: 10 * time.Second, Note: "answering within 2 s is recommended; the limit may be lowered", Source: "https://docs.polar.sh/integrate/webhooks/delivery#delivery-timeouts"},
		Answer:  Answer{Note: "a redirect is a failure, not followed", Source: "https://docs.polar.sh/integrate/webhooks/delivery#endpoint-disabling"},
		Refusal: Refusal{Note: "a failure like any non-2xx: retried, and counted towards disabling the endpoint", Source: "https://docs.polar.sh/integrate/webhooks/delivery#endpoint-disabling"},
	}
	register(polar)
	register(Preset{
		Name: "alchemy",
		Delivery: Delivery{
			// The FAQ gives Enterprise teams back-off up to an hour; the
			// quickstart's schedule is the bound for everyone.
			Retry: Retry{
				Retries: true, For: 11*time.Minute + 15*time.Second, Attempts: 4,
				Note:   "a non-200 or unreachable server is retried up to 3 times, after 15 s, 1 min and 10 min",
				Source: "https://www.alchemy.com/docs/reference/notify-api-quickstart#webhook-retry-logic",
			},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Duration: 5 * time.Second, Note: "answer before processing", Source: "https://www.alchemy.com/docs/reference/notify-api-faq#what-sort-of-timeouts-are-set"},
			Answer:  Answer{Status: 200, Source: "https://www.alchemy.com/docs/reference/notify-api-faq#how-should-i-respond-to-webhook-http-events"},
			Refusal: Refusal{Note: "a non-200 is retried; repeated ones pause the webhook", Source: "https://www.alchemy.com/docs/reference/notify-api-faq#how-should-i-respond-to-webhook-http-events"},
		},
		Doc:             "https://www.alchemy.com/docs/reference/notify-api-quickstart#webhook-signature--security",
		SignatureHeader: "X-Alchemy-Signature: <hex>",
		EventID:         ids(jsonID("id")),
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "X-Alchemy-Signature"}},
			Signed:    "{body}",
			Algorithm: "sha256",
			Encoding:  "hex",
		},
	})
	// Mux: "t=<ts>,v1=<hex>" over "<t>.<body>"; @mux/mux-node allows 300 s.
	register(Preset{
		Name: "mux",
		Delivery: Delivery{
			Retry: Retry{
				Retries: true, For: 24 * time.Hour,
				Note:   "anything but a 2xx is tried again for the next 24 hours with an increasing delay; duplicates may come even after a 2xx",
				Source: "https://docs.mux.com/guides/system/listen-for-webhooks",
			},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Duration: 5 * time.Second, Note: "a slower attempt fails and is tried again", Source: "https://docs.mux.com/docs/webhooks"},
			Answer:  Answer{Source: "https://docs.mux.com/guides/system/listen-for-webhooks"},
			Refusal: Refusal{Source: Undocumented},
		},
		Doc:              "https://www.mux.com/docs/core/verify-webhook-signatures",
		SignatureHeader:  "Mux-Signature: t=<ts>,v1=<hex>",
		DefaultTolerance: 5 * time.Minute,
		EventID:          ids(jsonID("id")),
		Oracle:           "@mux/mux-node",
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "Mux-Signature"}},
			Format:    Format{List: ",", Pair: "=", SigKey: "v1", TimestampKey: "t"},
			Signed:    "{timestamp}.{body}",
			Algorithm: "sha256",
			Encoding:  "hex",
		},
	})
}
