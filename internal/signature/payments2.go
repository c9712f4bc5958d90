package signature

import (
	"net/http"
	"regexp"
	"time"
)

// easypostWeight is the rewrite EasyPost's libraries apply before hashing
// (JavaScript: /("weight":\s*)(\d+)(\s*)(?=,|\})/g → "$1$2.0", which drops
// the spaces before the delimiter); the delimiter is captured instead of
// looked ahead, which RE2 lacks.
var easypostWeight = regexp.MustCompile(`("weight":\s*)(\d+)(\s*)([,}])`)

// easypostSigned returns the bytes EasyPost signs for body.
func easypostSigned(body []byte) []byte {
	if !easypostWeight.Match(body) {
		return body
	}
	return easypostWeight.ReplaceAll(body, []byte("${1}${2}.0${4}"))
}

type easypost struct{ e signer }

func (v easypost) Verify(body []byte, h http.Header) error {
	return v.e.Verify(easypostSigned(body), h)
}

func (v easypost) sign(body []byte, h http.Header, ts time.Time) error {
	return v.e.sign(easypostSigned(body), h, ts)
}

// Payments, accounting and shipping providers beyond commerce.go.
func init() {
	// GoCardless batches events; each has an id that stays the same when
	// the delivery is retried.
	register(Preset{
		Name: "gocardless",
		Delivery: Delivery{
			Retry: Retry{
				Retries: true, Attempts: 9,
				Note:   "up to 8 retries at growing intervals (1 min, 2 min, 10 min, …); a timeout, a refused authorisation or a redirect is a failure",
				Source: "https://support.gocardless.com/hc/en-nz/articles/360000989989-Webhook-retries-failures",
			},
			Timeout: Timeout{Duration: 10 * time.Second, Source: "https://support.gocardless.com/hc/en-nz/articles/360000989989-Webhook-retries-failures"},
			Answer:  Answer{Note: "a 2xx within 10 seconds; redirects are not followed", Source: "https://support.gocardless.com/hc/en-nz/articles/360000989989-Webhook-retries-failures"},
			MaxBody: MaxBody{Source: Undocumented},
			Refusal: Refusal{Note: "an answer refusing the request's authorisation is a failure, retried like any other", Source: "https://support.gocardless.com/hc/en-nz/articles/360000989989-Webhook-retries-failures"},
		},
		Doc:             "https://developer.gocardless.com/getting-started/staying-up-to-date-with-webhooks",
		SignatureHeader: "Webhook-Signature: <hex>",
		DedupeBody:      true,
		Oracle:          "gocardless-nodejs",
		Batch:           &Batch{Items: "events", ItemID: "id", Policy: BatchSet},
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "Webhook-Signature"}},
			Signed:    "{body}",
			Algorithm: "sha256",
			Encoding:  "hex",
		},
	})
	// EasyPost keys the HMAC with the NFKD form of the secret; for ASCII
	// secrets (what EasyPost's dashboard generates) that is the secret.
	// EasyPost signs integer "weight" values written as floats (10 as
	// 10.0), so its libraries rewrite them before hashing; so does this
	// preset (easypostSigned).
	register(Preset{
		Name: "easypost",
		Delivery: Delivery{
			Retry: Retry{
				Retries: true, For: 24 * time.Hour,
				Note:   "progressive back-off covers an endpoint down for less than 24 hours; after that, resend through the events API",
				Source: "https://www.easypost.com/if-the-customers-webhook-url-goes-down-how-does-easypost-respond",
			},
			Answer:  Answer{Note: "any other answer is a failure and is retried", Source: "https://docs.easypost.com/guides/webhooks-guide"},
			Refusal: Refusal{Note: "a non-2xx answer is a failure and is retried", Source: "https://docs.easypost.com/guides/webhooks-guide"},
		},
		Doc:             "https://docs.easypost.com/guides/webhooks-guide#hmac-validation",
		SignatureHeader: "X-Hmac-Signature: hmac-sha256-hex=<hex>",
		EventID:         ids(jsonID("id")),
		Oracle:          "@easypost/api",
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "X-Hmac-Signature"}},
			Format:    Format{Prefix: "hmac-sha256-hex="},
			Signed:    "{body} with integer weights as floats",
			Algorithm: "sha256",
			Encoding:  "hex",
		},
		build: func(p Preset, o Options) (signer, error) {
			s := p.Scheme
			s.Signed = "{body}"
			e, err := newEngine(p, s, o)
			if err != nil {
				return nil, err
			}
			return easypost{e}, nil
		},
	})
	// Xero: the "intent to receive" is a signed POST with an empty events
	// array, answered 200 when the signature matches (401 otherwise).
	// Events carry no ID: configure one.
	register(Preset{
		Name: "xero",
		Delivery: Delivery{
			Retry: Retry{
				Retries: true, For: 24 * time.Hour,
				Note:   "retried with decreasing frequency; after 24 hours the webhook is disabled until re-enabled",
				Source: "https://developer.xero.com/documentation/guides/webhooks/configuring-your-server/",
			},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Duration: 5 * time.Second, Source: "https://developer.xero.com/documentation/guides/webhooks/configuring-your-server/"},
			Answer:  Answer{Status: 200, Note: "within 5 seconds, no body, no cookies", Source: "https://developer.xero.com/documentation/guides/webhooks/configuring-your-server/"},
			Refusal: Refusal{
				Status: 401, Note: "an invalid signature must be answered 401 Unauthorized; the intent-to-receive validation checks it",
				Source: "https://developer.xero.com/documentation/guides/webhooks/configuring-your-server/",
			},
		},
		Doc:             "https://developer.xero.com/documentation/guides/webhooks/configuring-your-server/",
		SignatureHeader: "x-xero-signature: <base64>",
		DedupeBody:      true,
		Challenges: []Challenge{{
			Name: "intent to receive", Method: http.MethodPost, BodyField: "events.#", BodyValue: "0",
			Auth: AuthSignature, Answer: AnswerEmpty,
		}},
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "x-xero-signature"}},
			Signed:    "{body}",
			Algorithm: "sha256",
			Encoding:  "base64",
		},
	})
	// Intuit (QuickBooks Online): keyed with the app's verifier token.
	register(Preset{
		Name: "intuit",
		Delivery: Delivery{
			// No end to the retries is stated: after 6 h they stay 6 h apart.
			Retry: Retry{
				Retries: true,
				Note:    "retried after 10 s, 20 s, 30 s, 5 min, 20 min, 2 h, 4 h, 6 h, then every 6 hours; later events may wait until the first is acknowledged",
				Source:  "https://developer.intuit.com/app/developer/qbo/docs/develop/webhooks/best-practices#respond-promptly-to-notifications",
			},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Duration: 3 * time.Second, Source: "https://developer.intuit.com/app/developer/qbo/docs/develop/webhooks/best-practices#respond-promptly-to-notifications"},
			Answer:  Answer{Status: 200, Note: "within 3 seconds; process asynchronously", Source: "https://developer.intuit.com/app/developer/qbo/docs/develop/webhooks/best-practices#respond-promptly-to-notifications"},
			Refusal: Refusal{Source: Undocumented},
		},
		Doc:             "https://developer.intuit.com/app/developer/qbo/docs/develop/webhooks/managing-webhooks-notifications",
		SignatureHeader: "intuit-signature: <base64>",
		DedupeBody:      true,
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "intuit-signature"}},
			Signed:    "{body}",
			Algorithm: "sha256",
			Encoding:  "base64",
		},
	})
}
