package signature

import "time"

// Commerce and payment providers beyond the first group: an HMAC of the body
// in one header, no timestamp. Checked against the providers'
// documentation; no conformance vectors yet. Where the default event ID is
// an unsigned header, or there is none, DedupeBody is on.
func init() {
	// WooCommerce has no event ID: X-WC-Webhook-Delivery-ID is a hash of
	// the webhook ID and the send time (WC_Webhook::get_new_delivery_id), a
	// new value on every delivery, so it cannot be the default. Configure
	// one, e.g. `event_id header X-WC-Webhook-ID json id json
	// date_modified_gmt` (the resource at one modification); dedupe_body
	// stays on.
	register(Preset{
		Name: "woocommerce",
		// WooCommerce's documentation states none of these; its delivery
		// code (WC_Webhook::deliver and log_delivery) does.
		Delivery: Delivery{
			Retry: Retry{
				Note:   "a failed delivery is not sent again; more than 5 consecutive failures disable the webhook",
				Source: "https://github.com/woocommerce/woocommerce/blob/trunk/plugins/woocommerce/includes/class-wc-webhook.php",
			},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Duration: time.Minute, Note: "redirects are not followed", Source: "https://github.com/woocommerce/woocommerce/blob/trunk/plugins/woocommerce/includes/class-wc-webhook.php"},
			Answer:  Answer{Note: "a 2xx, 301 or 302 counts as delivered", Source: "https://github.com/woocommerce/woocommerce/blob/trunk/plugins/woocommerce/includes/class-wc-webhook.php"},
			Refusal: Refusal{Note: "counts as a failed delivery toward disabling the webhook", Source: "https://github.com/woocommerce/woocommerce/blob/trunk/plugins/woocommerce/includes/class-wc-webhook.php"},
		},
		Doc:             "https://developer.woocommerce.com/docs/apis/rest-api/v2/webhooks/",
		SignatureHeader: "X-WC-Webhook-Signature: <base64>",
		DedupeBody:      true,
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "X-WC-Webhook-Signature"}},
			Signed:    "{body}",
			Algorithm: "sha256",
			Encoding:  "base64",
		},
	})
	// Paystack events carry no event ID; configure one per route.
	register(Preset{
		Name: "paystack",
		Delivery: Delivery{
			Retry: Retry{
				Retries: true, For: 72 * time.Hour,
				Note:   "live mode: every 3 minutes for the first 4 tries, then hourly for 72 hours; test mode: hourly for 10 hours",
				Source: "https://paystack.com/docs/payments/webhooks/",
			},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Duration: 30 * time.Second, Note: "stated beside the test-mode schedule", Source: "https://paystack.com/docs/payments/webhooks/"},
			Answer:  Answer{Status: 200, Note: "anything else is a failed attempt; answer before long-running work", Source: "https://paystack.com/docs/payments/webhooks/"},
			Refusal: Refusal{Note: "a non-200 answer is retried like any failure", Source: "https://paystack.com/docs/payments/webhooks/"},
		},
		Doc:             "https://paystack.com/docs/payments/webhooks/#verify-event-origin",
		SignatureHeader: "x-paystack-signature: <hex>",
		DedupeBody:      true,
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "x-paystack-signature"}},
			Signed:    "{body}",
			Algorithm: "sha512",
			Encoding:  "hex",
		},
	})
	// Lemon Squeezy events carry no event ID; configure one per route.
	register(Preset{
		Name: "lemonsqueezy",
		Delivery: Delivery{
			Retry: Retry{
				Retries: true, Attempts: 4,
				Note:   "any status but 200 is retried up to three more times with exponential back-off (e.g. 5 s, 25 s, 125 s), then given up",
				Source: "https://docs.lemonsqueezy.com/help/webhooks/webhook-requests",
			},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Source: Undocumented},
			Answer:  Answer{Status: 200, Source: "https://docs.lemonsqueezy.com/help/webhooks/webhook-requests"},
			Refusal: Refusal{Note: "retried like any answer other than 200", Source: "https://docs.lemonsqueezy.com/help/webhooks/webhook-requests"},
		},
		Doc:             "https://docs.lemonsqueezy.com/help/webhooks/signing-requests",
		SignatureHeader: "X-Signature: <hex>",
		DedupeBody:      true,
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "X-Signature"}},
			Signed:    "{body}",
			Algorithm: "sha256",
			Encoding:  "hex",
		},
	})
	register(Preset{
		Name: "coinbase",
		Delivery: Delivery{
			Retry: Retry{
				Retries: true, For: 3 * 24 * time.Hour,
				Note:   "exponential back-off, at most 1 hour apart",
				Source: "https://docs.cdp.coinbase.com/commerce/api-arcitecture/webhooks-overview",
			},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Source: Undocumented},
			Answer:  Answer{Status: 200, Source: "https://docs.cdp.coinbase.com/commerce/api-arcitecture/webhooks-overview"},
			Refusal: Refusal{Source: Undocumented},
		},
		Doc:             "https://docs.cdp.coinbase.com/commerce/api-arcitecture/webhooks-security",
		SignatureHeader: "X-CC-Webhook-Signature: <hex>",
		Oracle:          "coinbase-commerce-node",
		EventID:         ids(jsonID("event.id")),
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "X-CC-Webhook-Signature"}},
			Signed:    "{body}",
			Algorithm: "sha256",
			Encoding:  "hex",
		},
	})
	register(Preset{
		Name: "checkout",
		Delivery: Delivery{
			Retry: Retry{
				Retries: true, For: 15*time.Hour + 50*time.Minute, Attempts: 8,
				Note:   "best-effort retries after 5 min, 15 min, 30 min, 1 h, 2 h, 4 h and 8 h, then an email; an event type that keeps failing is unsubscribed from the endpoint",
				Source: "https://checkoutdocs.readme.io/docs/webhooks",
			},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Duration: 10 * time.Second, Note: "an unacknowledged webhook times out and fails", Source: "https://www.checkout.com/docs/business-operations/use-the-dashboard/developers/webhooks"},
			Answer:  Answer{Note: "acknowledge within 10 seconds", Source: "https://www.checkout.com/docs/business-operations/use-the-dashboard/developers/webhooks"},
			Refusal: Refusal{Source: Undocumented},
		},
		Doc:             "https://www.checkout.com/docs/developer-resources/webhooks/manage-webhooks/receive-webhooks",
		SignatureHeader: "Cko-Signature: <hex>",
		EventID:         ids(jsonID("id")),
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "Cko-Signature"}},
			Signed:    "{body}",
			Algorithm: "sha256",
			Encoding:  "hex",
		},
	})
}
