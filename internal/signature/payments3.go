package signature

import (
	"crypto/hmac"
	"crypto/sha1" //nolint:gosec // Braintree's documented scheme is HMAC-SHA1 keyed with SHA-1 of the private key
	"crypto/sha256"
	"crypto/sha512"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/eventid"
)

// Payment providers of issue 25 beyond adyen.go: the HMAC schemes the
// generic engine runs (mollie, recurly, revolut, airwallex, fastspring,
// authorizenet), plain shared tokens and Basic credentials (flutterwave,
// xendit, chargebee), and the schemes with code of their own (midtrans's
// signature in the body, mercadopago's manifest, rapyd's salted HMAC over
// the URL and both keys, braintree's signed form).
func init() {
	// Mollie's next-gen webhooks. During a secret rotation Mollie sends
	// two X-Mollie-Signature headers for 24 hours; mollieHeaders joins
	// them so either may match (mollie-api-typescript accepts a list).
	register(Preset{
		Name: "mollie",
		Delivery: Delivery{
			// The next-gen page refers to the retry schema of Mollie's
			// webhook overview.
			Retry: Retry{
				Retries: true, For: 26 * time.Hour, Attempts: 10,
				Note:   "anything but 200 or an answer later than 15 s is tried again after 1, 2, 4, 8, 16, 29 min, 1, 2 and 22 h",
				Source: "https://docs.mollie.com/overview/webhooks#retry-schema",
			},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Duration: 15 * time.Second, Source: "https://docs.mollie.com/reference/webhooks-new"},
			Answer:  Answer{Note: "a success status such as 200, quickly; avoid complex logic in the handler", Source: "https://docs.mollie.com/reference/webhooks-new"},
			Refusal: Refusal{Source: Undocumented},
		},
		Doc:             "https://docs.mollie.com/reference/webhooks-new#manual-signature-verification",
		SignatureHeader: "X-Mollie-Signature: sha256=<hex> (two headers during a rotation)",
		EventID:         ids(jsonID("id")),
		Oracle:          "mollie-api-typescript",
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "X-Mollie-Signature"}},
			Format:    Format{List: ",", Pair: "=", SigKey: "sha256"},
			Signed:    "{body}",
			Algorithm: "sha256",
			Encoding:  "hex",
		},
		build: func(p Preset, o Options) (signer, error) {
			e, err := newEngine(p, p.Scheme, o)
			if err != nil {
				return nil, err
			}
			return joinedHeader{e, "X-Mollie-Signature"}, nil
		},
	})
	// Recurly (JSON webhooks; XML ones are not signed): recurly-signature
	// is "<unix ms>,<hex>[,<hex>]", HMAC-SHA256 of "<ms>.<body>". Recurly's
	// client libraries refuse a timestamp more than 5 minutes away.
	register(Preset{
		Name:             "recurly",
		Doc:              "https://docs.recurly.com/recurly-subscriptions/docs/signature-verification",
		SignatureHeader:  "recurly-signature: <unix ms>,<hex>[,<hex>]",
		DefaultTolerance: 5 * time.Minute,
		EventID:          ids(jsonID("id")),
		Delivery: Delivery{
			Retry: Retry{
				Retries: true, For: 91 * time.Hour, Attempts: 11,
				Note:   "any non-2xx; up to 10 retries, the n-th after about 10+n·2^(n+5) s, in creation order",
				Source: "https://docs.recurly.com/recurly-subscriptions/v2021-02-25/docs/automatic-retries",
			},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Duration: 5 * time.Second, Source: "https://docs.recurly.com/recurly-subscriptions/docs/overview-webhooks"},
			Answer:  Answer{Note: "any 2xx within 5 seconds; a redirect is not followed and counts as a failure", Source: "https://docs.recurly.com/recurly-subscriptions/docs/overview-webhooks"},
			Refusal: Refusal{Note: "any non-2xx is a failure and is retried", Source: "https://docs.recurly.com/recurly-subscriptions/docs/overview-webhooks"},
		},
		Scheme: Scheme{
			Headers:       []HeaderSet{{Signature: "recurly-signature"}},
			Format:        Format{List: ",", TimestampFirst: true},
			Signed:        "{timestamp}.{body}",
			Algorithm:     "sha256",
			Encoding:      "hex",
			TimestampUnit: time.Millisecond,
		},
	})
	// Revolut (Merchant API): Revolut-Signature "v1=<hex>[,v1=<hex>]"
	// (one per active secret), HMAC-SHA256 of "v1.<ms>.<body>" with the
	// timestamp from Revolut-Request-Timestamp, checked within 5 minutes
	// as Revolut recommends. The body names an order, not an event:
	// configure event_id.
	register(Preset{
		Name: "revolut",
		Delivery: Delivery{
			Retry: Retry{
				Retries: true, For: 30 * time.Minute, Attempts: 4,
				Note:   "an HTTP error or a timeout is retried 3 more times, 10 minutes apart",
				Source: "https://developer.revolut.com/docs/guides/accept-payments/tutorials/work-with-webhooks/using-webhooks",
			},
			MaxBody: MaxBody{Source: Undocumented},
			// A timeout fails the delivery; its length is not given.
			Timeout: Timeout{Source: Undocumented},
			Answer:  Answer{Source: Undocumented},
			Refusal: Refusal{Note: "an HTTP error answer is retried like any failure", Source: "https://developer.revolut.com/docs/guides/accept-payments/tutorials/work-with-webhooks/using-webhooks"},
		},
		Doc:              "https://developer.revolut.com/docs/guides/accept-payments/tutorials/work-with-webhooks/verify-the-payload-signature",
		SignatureHeader:  "Revolut-Signature: v1=<hex>[,v1=<hex>] (with Revolut-Request-Timestamp, ms)",
		DefaultTolerance: 5 * time.Minute,
		Scheme: Scheme{
			Headers:       []HeaderSet{{Signature: "Revolut-Signature", Timestamp: "Revolut-Request-Timestamp"}},
			Format:        Format{List: ",", Pair: "=", SigKey: "v1"},
			Signed:        "v1.{timestamp}.{body}",
			Algorithm:     "sha256",
			Encoding:      "hex",
			TimestampUnit: time.Millisecond,
		},
	})
	// Airwallex: x-signature is the hex HMAC-SHA256 of x-timestamp (ms)
	// followed by the body. Each event has a stable id across retries.
	register(Preset{
		Name:             "airwallex",
		Doc:              "https://www.airwallex.com/docs/developer-tools/webhooks/listen-for-webhook-events",
		SignatureHeader:  "x-signature: <hex> (with x-timestamp, ms)",
		DefaultTolerance: 5 * time.Minute,
		EventID:          ids(jsonID("id")),
		IDStability:      StabilityStable, // "Each event has a stable id so you can safely handle retries"
		Delivery: Delivery{
			Retry: Retry{
				Retries: true, For: 3 * 24 * time.Hour,
				Note:   "anything but 200, or a timeout, is retried with exponential backoff",
				Source: "https://www.airwallex.com/docs/developer-tools/webhooks/webhooks-overview",
			},
			Answer:  Answer{Status: 200, Source: "https://www.airwallex.com/docs/developer-tools/webhooks/webhooks-overview"},
			MaxBody: MaxBody{Source: Undocumented},
			// A timeout counts as a failure; its length is not given.
			Timeout: Timeout{Source: Undocumented},
			Refusal: Refusal{Note: "anything but 200 is a failed delivery and is retried", Source: "https://www.airwallex.com/docs/developer-tools/webhooks/webhooks-overview"},
		},
		Scheme: Scheme{
			Headers:       []HeaderSet{{Signature: "x-signature", Timestamp: "x-timestamp"}},
			Signed:        "{timestamp}{body}",
			Algorithm:     "sha256",
			Encoding:      "hex",
			TimestampUnit: time.Millisecond,
		},
	})
	// FastSpring batches events in events[]; automatic retries keep each
	// event's id (manual resends get new ones).
	register(Preset{
		Name: "fastspring",
		Delivery: Delivery{
			Retry: Retry{
				Retries: true, For: 7 * 24 * time.Hour, Attempts: 13,
				Note:   "an event not marked processed is retried 1 h, 2 h, 4 h, then 6 h apart, then daily, at most 12 times within 7 days; retries keep each event's id",
				Source: "https://developer.fastspring.com/reference/processed-and-unprocessed-webhook-events",
			},
			Answer: Answer{
				Status: 200, Note: "200 marks every event of the post processed; 202 with event IDs, one a line, marks only those; any other status is a failure",
				Source: "https://developer.fastspring.com/reference/processed-and-unprocessed-webhook-events",
			},
			Refusal: Refusal{
				Note:   "any status but 200 or 202 marks the events failed, and they are retried",
				Source: "https://developer.fastspring.com/reference/processed-and-unprocessed-webhook-events",
			},
		},
		Doc:             "https://developer.fastspring.com/docs/message-security",
		SignatureHeader: "X-FS-Signature: <base64>",
		DedupeBody:      true,
		Batch:           &Batch{Items: "events", ItemID: "id", Policy: BatchSet},
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "X-FS-Signature"}},
			Signed:    "{body}",
			Algorithm: "sha256",
			Encoding:  "base64",
		},
	})
	// Authorize.Net: X-ANET-Signature "sha512=<HEX>", HMAC-SHA512 of the
	// body keyed with the Signature Key as text; the hex digest is upper
	// case (hex of either case is accepted).
	register(Preset{
		Name:            "authorizenet",
		Doc:             "https://developer.authorize.net/api/reference/features/webhooks.html#Verifying_the_Notification",
		SignatureHeader: "X-ANET-Signature: sha512=<HEX>",
		EventID:         ids(jsonID("notificationId")),
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "X-ANET-Signature"}},
			Format:    Format{Prefix: "sha512="},
			Signed:    "{body}",
			Algorithm: "sha512",
			Encoding:  "hex",
		},
	})
	// Flutterwave sends the dashboard's secret hash itself in verif-hash:
	// a token, no HMAC. The body's event names a transaction: configure
	// event_id (data.id with event, say).
	register(Preset{
		Name: "flutterwave",
		Delivery: Delivery{
			// Retries are a dashboard setting the gateway cannot see:
			// record the default (off) so the spool stays on.
			Retry: Retry{
				Note:   "only with webhook retries enabled on the dashboard: no 200 (or no answer) is retried 3 times, 30 minutes apart",
				Source: "https://developer.flutterwave.com/docs/webhooks",
			},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Duration: 60 * time.Second, Source: "https://developer.flutterwave.com/docs/webhooks"},
			Answer:  Answer{Status: 200, Note: "any other status, 3xx included, is a failure; answer before long-running work", Source: "https://developer.flutterwave.com/docs/webhooks"},
			Refusal: Refusal{Note: "a request without the right secret hash may be discarded; the page's example answers 401", Source: "https://developer.flutterwave.com/docs/webhooks"},
		},
		SecretFormat:    "the secret hash set on the dashboard",
		Doc:             "https://developer.flutterwave.com/docs/webhooks#verifying-webhook-signatures",
		SignatureHeader: "verif-hash: <secret hash>",
		DedupeBody:      true,
		Scheme: Scheme{
			Headers: []HeaderSet{{Signature: "verif-hash"}},
			Signed:  "none: the secret hash is sent as is",
		},
		build: buildToken,
	})
	// Xendit sends the account's verification token in x-callback-token
	// and a webhook-id that names the event for deduplication.
	register(Preset{ //nolint:gosec // G101: SecretFormat describes a secret, holds none
		Name: "xendit",
		Delivery: Delivery{
			Retry: Retry{
				Retries: true, For: 24 * time.Hour, Attempts: 7,
				Note:   "up to 6 retries with exponential back-off, 15 min to 24 h after the original; a delivery that timed out is not retried automatically",
				Source: "https://docs.xendit.co/webhook/delivery-attempts-and-retries/",
			},
			Answer:  Answer{Note: "any 2xx", Source: "https://docs.xendit.co/webhook/delivery-attempts-and-retries/"},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{
				Duration: 30 * time.Second, Note: "a timed-out delivery is only resent by hand",
				Source: "https://help.xendit.co/hc/en-us/articles/28686969138585-My-Webhook-URL-Cannot-Respond-to-Xendit-s-Webhook-within-30-seconds-What-Should-I-Do",
			},
			Refusal: Refusal{Source: Undocumented},
		},
		SecretFormat:    "the webhook verification token",
		Doc:             "https://docs.xendit.co/docs/handling-webhooks",
		SignatureHeader: "x-callback-token: <verification token>",
		EventID:         ids(headerID("webhook-id")),
		DedupeBody:      true,
		Scheme: Scheme{
			Headers: []HeaderSet{{Signature: "x-callback-token"}},
			Signed:  "none: the verification token is sent as is",
		},
		build: buildToken,
	})
	// Chargebee authenticates webhooks with the Basic credentials set on
	// the endpoint (the chargebee library's basicAuthValidator); nothing
	// signs the body. Secrets are "<user>:<password>".
	register(Preset{ //nolint:gosec // G101: SecretFormat describes a secret, holds none
		Name: "chargebee",
		Delivery: Delivery{
			Retry: Retry{
				Retries: true, Attempts: 8,
				Note:   "a timeout or error is retried up to 7 times on a growing schedule; the site's admins are mailed when all fail",
				Source: "https://chargebee.com/docs/2.0/site-configuration/articles-and-faq/at-which-rate-can-we-expect-the-webhook-calls-in-chargebee-will-there-be-any-performance-disruption.html",
			},
			Answer:  Answer{Status: 200, Source: "https://chargebee.com/docs/1.0/site-configuration/articles-and-faq/how-would-i-know-if-the-configured-webhook-url-in-my-chargebee-site-is-failing.html"},
			MaxBody: MaxBody{Source: Undocumented},
			// The page names a connection, a read and a total timeout but
			// gives none of their values.
			Timeout: Timeout{Source: Undocumented},
			Refusal: Refusal{Source: Undocumented},
		},
		SecretFormat:    "`<user>:<password>`, the Basic credentials set on the webhook",
		Doc:             "https://www.chargebee.com/docs/2.0/webhook_settings.html",
		SignatureHeader: "Authorization: Basic <user:password>",
		EventID:         ids(jsonID("id")),
		DedupeBody:      true,
		Oracle:          "chargebee",
		Scheme: Scheme{
			Headers: []HeaderSet{{Signature: "Authorization"}},
			Signed:  "none: Basic credentials",
		},
		build: buildBasicAuth,
	})
	// Midtrans writes signature_key into the notification: the hex
	// SHA-512 (not an HMAC) of order_id + status_code + gross_amount + the
	// server key. Only those three fields are signed and a transaction
	// gets one notification per status: configure event_id (order_id and
	// transaction_status, say).
	register(Preset{
		Name: "midtrans",
		Delivery: Delivery{
			Answer:  Answer{Status: 200, Note: "redirects (301, 302, 303) are not supported", Source: "https://docs.midtrans.com/docs/technical-faq"},
			Timeout: Timeout{Duration: 15 * time.Second, Note: "answer within 5 seconds", Source: "https://docs.midtrans.com/reference/best-practices-to-handle-notification"},
			// Each retry comes at a random time up to its interval, and
			// how many come depends on the status, so no span is certain.
			Retry: Retry{
				Retries: true, Attempts: 6,
				Note:   "at most 5 retries, each at random up to 2, 10, 30, 90 and 210 min after the failure; a 500 is retried once, a 503 4 times, other failures 5 times; 301/302/303 never",
				Source: "https://github.com/Midtrans/technical-documentation-site/blob/master/en/after-payment/http-notification.md#responding-http-notification-from-midtrans",
			},
			MaxBody: MaxBody{Source: Undocumented},
			Refusal: Refusal{
				Note:   "a 400 or 404 is retried twice",
				Source: "https://github.com/Midtrans/technical-documentation-site/blob/master/en/after-payment/http-notification.md#responding-http-notification-from-midtrans",
			},
		},
		SecretFormat:    "the server key",
		Doc:             "https://docs.midtrans.com/docs/https-notification-webhooks#verifying-notification-authenticity",
		SignatureHeader: "none: body signature_key = <hex SHA-512>",
		DedupeBody:      true,
		Scheme: Scheme{
			Signed:    "order_id + status_code + gross_amount + server key (SHA-512, no HMAC)",
			Algorithm: "sha512",
			Encoding:  "hex",
		},
		build: func(_ Preset, o Options) (signer, error) {
			return &midtrans{keys: o.Secrets}, nil
		},
	})
	// Mercado Pago: x-signature "ts=<s>,v1=<hex>", HMAC-SHA256 of the
	// manifest "id:<data.id>;request-id:<x-request-id>;ts:<ts>;" (a part
	// whose value is absent is left out). The body itself is not signed.
	register(Preset{
		Name: "mercadopago",
		Delivery: Delivery{
			// Other pages of the same documentation give 15 min, 30 min,
			// 6 h, 48 h and 96 h: the same four days.
			Retry: Retry{
				Retries: true, For: 4 * 24 * time.Hour, Attempts: 6,
				Note:   "retried 5 min, 45 min, 6 h, 2 days and 4 days after the first dispatch",
				Source: "https://www.mercadopago.com.ar/developers/en/guides/notifications/webhooks/",
			},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Duration: 22 * time.Second, Note: "22 s for the first dispatch, 5 s for each retry", Source: "https://www.mercadopago.com.ar/developers/en/guides/notifications/webhooks/"},
			Answer:  Answer{Note: "200 (OK) or 201 (Created) before the wait ends", Source: "https://www.mercadopago.com.ar/developers/en/guides/notifications/webhooks/"},
			Refusal: Refusal{Source: Undocumented},
		},
		Doc:              "https://www.mercadopago.com/developers/en/docs/your-integrations/notifications/webhooks#configuration-via-your-integrations",
		SignatureHeader:  "x-signature: ts=<ts>,v1=<hex> (with x-request-id)",
		DefaultTolerance: 5 * time.Minute,
		EventID:          ids(jsonID("id")),
		Oracle:           "mercadopago",
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "x-signature", ID: "x-request-id"}},
			Signed:    "id:<data.id>;request-id:<x-request-id>;ts:<ts>; (body not signed)",
			Algorithm: "sha256",
			Encoding:  "hex",
		},
		build: buildMercadoPago,
	})
	// Rapyd: signature = base64 of the hex HMAC-SHA256, keyed with the
	// secret key, of url + salt + timestamp + access key + secret key +
	// body, where url is the whole webhook URL configured at Rapyd.
	// Secrets are "<access key>:<secret key>".
	register(Preset{ //nolint:gosec // G101: SecretFormat describes a secret, holds none
		Name: "rapyd",
		Delivery: Delivery{
			Retry: Retry{
				Retries: true,
				Note:    "a failed webhook is retried (status RET) until a maximum number of retries, not stated, then ERR; Resend Webhook sends it again",
				Source:  "https://docs.rapyd.net/en/webhooks.html",
			},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Source: Undocumented},
			Answer:  Answer{Source: Undocumented},
			Refusal: Refusal{Source: Undocumented},
		},
		SecretFormat:     "`<access key>:<secret key>`",
		Doc:              "https://docs.rapyd.net/en/webhook-authentication.html",
		SignatureHeader:  "signature: <base64 of hex> (with salt, timestamp)",
		DefaultTolerance: 5 * time.Minute,
		EventID:          ids(jsonID("id")),
		NeedsURL:         true,
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "signature", Timestamp: "timestamp"}},
			Signed:    "url + salt + timestamp + access key + secret key + body",
			Algorithm: "sha256",
			Encoding:  "base64",
		},
		build: buildRapyd,
	})
	// Braintree posts a form: bt_payload is the base64 XML notification,
	// bt_signature "<public key>|<hex HMAC-SHA1 of bt_payload keyed with
	// SHA-1(private key)>" pairs joined by "&". Secrets are "<public
	// key>:<private key>" (one per API key pair). The notification has
	// no ID outside the payload: the default event ID is the SHA-256 of
	// bt_payload. The signature verifies bt_payload with its trailing
	// newline taken off too, a second event ID for one notification:
	// DedupeBody, on the payload without trailing newlines (Covered). The
	// bt_challenge GET verifies the destination.
	register(Preset{ //nolint:gosec // G101: SecretFormat describes a secret, holds none
		Name: "braintree",
		Delivery: Delivery{
			Retry: Retry{
				Retries: true, For: 24 * time.Hour,
				Note:   "resent every hour until a 2xx within 30 s, for up to 24 hours in production (3 hours in sandbox)",
				Source: "https://developer.paypal.com/braintree/docs/guides/webhooks/parse",
			},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Duration: 30 * time.Second, Note: "a slower answer is a timeout and is retried", Source: "https://developer.paypal.com/braintree/docs/guides/webhooks/parse"},
			Answer:  Answer{Note: "any 2xx within 30 seconds", Source: "https://developer.paypal.com/braintree/docs/guides/webhooks/parse"},
			Refusal: Refusal{Source: Undocumented},
		},
		SecretFormat:    "`<public key>:<private key>`, one per API key pair",
		Doc:             "https://developer.paypal.com/braintree/docs/guides/webhooks/parse/node",
		SignatureHeader: "none: form fields bt_signature (public key|hex) and bt_payload",
		EventID:         ids("form_sha256 bt_payload"),
		DedupeBody:      true,
		Oracle:          "braintree",
		covers:          braintreeCovers,
		Challenges: []Challenge{{
			Name: "bt_challenge", Method: http.MethodGet, Query: "bt_challenge",
			Auth: AuthNone, Answer: AnswerBraintree, Echo: "query bt_challenge",
		}},
		Scheme: Scheme{
			Signed:    "bt_payload (or bt_payload + newline)",
			Algorithm: "sha1",
			Encoding:  "hex",
		},
		build: buildBraintree,
	})
}

// joinedHeader verifies with a header's several lines joined by commas,
// for providers that send one signature per line (Mollie's rotation).
type joinedHeader struct {
	e    signer
	name string
}

func (j joinedHeader) Verify(body []byte, h http.Header) error {
	if vs := h.Values(j.name); len(vs) > 1 {
		c := h.Clone()
		c.Set(j.name, strings.Join(vs, ","))
		h = c
	}
	return j.e.Verify(body, h)
}

func (j joinedHeader) sign(body []byte, h http.Header, ts time.Time) error {
	return j.e.sign(body, h, ts)
}

// buildToken is a plain shared token carried in the preset's header.
func buildToken(p Preset, o Options) (signer, error) {
	v := &tokenVerifier{header: p.Headers[0].Signature, first: o.Secrets[0]}
	for _, s := range o.Secrets {
		d := sha256.Sum256([]byte(s))
		v.digests = append(v.digests, d[:])
	}
	return v, nil
}

// basicAuth checks Authorization: Basic against "<user>:<password>"
// secrets, reading the header as the chargebee library does (exactly
// "Basic <base64>", the credentials split at the first colon).
type basicAuth struct {
	digests [][]byte
	first   string
}

func buildBasicAuth(_ Preset, o Options) (signer, error) {
	b := &basicAuth{first: o.Secrets[0]}
	for i, s := range o.Secrets {
		if !strings.Contains(s, ":") {
			return nil, fmt.Errorf("secret %d: write Basic credentials as <user>:<password>", i+1)
		}
		d := sha256.Sum256([]byte(s))
		b.digests = append(b.digests, d[:])
	}
	return b, nil
}

func (b *basicAuth) Verify(_ []byte, h http.Header) error {
	v, err := oneValue(h, "Authorization")
	if err != nil {
		return err
	}
	scheme, cred, ok := strings.Cut(v, " ")
	if !ok || scheme != "Basic" || strings.Contains(cred, " ") {
		return fmt.Errorf("header Authorization is not Basic credentials: %w", ErrMalformedHeader)
	}
	raw, err := base64.StdEncoding.DecodeString(cred)
	if err != nil || !strings.Contains(string(raw), ":") {
		return fmt.Errorf("header Authorization does not hold base64 user:password: %w", ErrMalformedHeader)
	}
	d := sha256.Sum256(raw)
	ok2 := 0
	for _, want := range b.digests {
		ok2 |= subtle.ConstantTimeCompare(d[:], want)
	}
	if ok2 == 0 {
		return fmt.Errorf("header Authorization matches none of %d credential(s): %w", len(b.digests), ErrNoMatchingSignature)
	}
	return nil
}

func (b *basicAuth) sign(_ []byte, h http.Header, _ time.Time) error {
	h.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(b.first)))
	return nil
}

// midtrans verifies the signature_key Midtrans writes into the body.
type midtrans struct{ keys []string }

var midtransFields = []string{"order_id", "status_code", "gross_amount"}

func (m *midtrans) Verify(body []byte, _ http.Header) error {
	body = eventid.JSONText(body)
	if !isJSONObject(body) {
		return fmt.Errorf("body is not a JSON object carrying signature_key: %w", ErrMissingHeader)
	}
	sigField, err := lookupOnce(body, "signature_key")
	if err != nil {
		return err
	}
	if !sigField.Exists() {
		return fmt.Errorf("body field signature_key: %w", ErrMissingHeader)
	}
	sig, err := hex.DecodeString(sigField.Str)
	if sigField.Type != gjson.String || err != nil || len(sig) != sha512.Size {
		return fmt.Errorf("body field signature_key is not a hex SHA-512 digest: %w", ErrMalformedHeader)
	}
	signed, err := midtransSigned(body)
	if err != nil {
		return err
	}
	for _, k := range m.keys {
		sum := sha512.Sum512(append(signed, k...))
		if hmac.Equal(sum[:], sig) {
			return nil
		}
	}
	return fmt.Errorf("signature_key matches none of %d server key(s): %w", len(m.keys), ErrNoMatchingSignature)
}

// midtransSigned is order_id + status_code + gross_amount, each a string
// field given once.
func midtransSigned(body []byte) ([]byte, error) {
	var b []byte
	for _, f := range midtransFields {
		v, err := lookupOnce(body, f)
		if err != nil {
			return nil, err
		}
		if v.Type != gjson.String {
			return nil, fmt.Errorf("body field %s is not a string: %w", f, ErrMalformedHeader)
		}
		b = append(b, v.Str...)
	}
	return b, nil
}

func (m *midtrans) signBody(body []byte, _ time.Time) ([]byte, error) {
	signed, err := midtransSigned(body)
	if err != nil {
		return nil, err
	}
	sum := sha512.Sum512(append(signed, m.keys[0]...))
	return sjson.SetBytes(body, "signature_key", hex.EncodeToString(sum[:]))
}

func (m *midtrans) sign([]byte, http.Header, time.Time) error {
	return errors.New("midtrans signs inside the body: use SignDelivery")
}

// mercadoPago verifies Mercado Pago's x-signature as the mercadopago
// library's WebhookSignatureValidator does, with data.id read from the
// body (the same value as the notification URL's data.id query) and
// lower-cased as Mercado Pago's documentation asks.
type mercadoPago struct {
	keys      [][]byte
	tolerance time.Duration
	now       func() time.Time
}

func buildMercadoPago(p Preset, o Options) (signer, error) {
	m := &mercadoPago{}
	m.tolerance, m.now = clock(p, o)
	for _, s := range o.Secrets {
		m.keys = append(m.keys, []byte(s))
	}
	return m, nil
}

var digitsOnly = regexp.MustCompile(`^[0-9]+$`)

func (m *mercadoPago) Verify(body []byte, h http.Header) error {
	raw, err := oneValue(h, "x-signature")
	if err != nil {
		return err
	}
	var ts string
	var sigs [][]byte
	for part := range strings.SplitSeq(raw, ",") {
		k, v, ok := strings.Cut(part, "=")
		k, v = strings.ToLower(strings.TrimSpace(k)), strings.TrimSpace(v)
		if !ok || k == "" || v == "" {
			continue
		}
		switch k {
		case "ts":
			ts = v
		case "v1":
			if s, err := hex.DecodeString(v); err == nil && len(s) == sha256.Size {
				sigs = append(sigs, s)
			}
		}
	}
	if ts == "" || !digitsOnly.MatchString(ts) {
		return fmt.Errorf("header x-signature has no ts= of digits: %w", ErrMalformedHeader)
	}
	if len(sigs) == 0 {
		return fmt.Errorf("header x-signature has no usable v1 signature: %w", ErrMalformedHeader)
	}
	manifest, err := m.manifest(body, h, ts)
	if err != nil {
		return err
	}
	matched := false
	for _, k := range m.keys {
		mac := hmac.New(sha256.New, k)
		mac.Write(manifest)
		sum := mac.Sum(nil)
		for _, s := range sigs {
			matched = hmac.Equal(sum, s) || matched
		}
	}
	if !matched {
		return fmt.Errorf("x-signature: %d signature(s) checked against %d secret(s): %w", len(sigs), len(m.keys), ErrNoMatchingSignature)
	}
	return checkTimestamp(ts, time.Second, m.tolerance, m.now())
}

// manifest builds "id:<data.id>;request-id:<x-request-id>;ts:<ts>;".
func (m *mercadoPago) manifest(body []byte, h http.Header, ts string) ([]byte, error) {
	body = eventid.JSONText(body)
	var b strings.Builder
	if isJSONObject(body) {
		id, err := lookupOnce(body, "data.id")
		if err != nil {
			return nil, err
		}
		var v string
		switch id.Type {
		case gjson.String:
			v = strings.ToLower(strings.TrimSpace(id.Str))
		case gjson.Number:
			v = id.Raw
		}
		if v != "" {
			b.WriteString("id:" + v + ";")
		}
	}
	if vs := h.Values("x-request-id"); len(vs) > 0 {
		rid, err := oneValue(h, "x-request-id")
		if err != nil {
			return nil, err
		}
		if rid = strings.TrimSpace(rid); rid != "" {
			b.WriteString("request-id:" + rid + ";")
		}
	}
	b.WriteString("ts:" + ts + ";")
	return []byte(b.String()), nil
}

func (m *mercadoPago) sign(body []byte, h http.Header, ts time.Time) error {
	tsText := strconv.FormatInt(ts.Unix(), 10)
	manifest, err := m.manifest(body, h, tsText)
	if err != nil {
		return err
	}
	mac := hmac.New(sha256.New, m.keys[0])
	mac.Write(manifest)
	h.Set("x-signature", "ts="+tsText+",v1="+hex.EncodeToString(mac.Sum(nil)))
	return nil
}

// rapyd verifies Rapyd's salted signature over the configured URL.
type rapyd struct {
	creds     [][2]string // access key, secret key
	url       string
	tolerance time.Duration
	now       func() time.Time
}

func buildRapyd(p Preset, o Options) (signer, error) {
	r := &rapyd{url: o.URL}
	r.tolerance, r.now = clock(p, o)
	for i, s := range o.Secrets {
		access, secret, ok := strings.Cut(s, ":")
		if !ok || access == "" || secret == "" {
			return nil, fmt.Errorf("secret %d: write Rapyd's keys as <access key>:<secret key>", i+1)
		}
		r.creds = append(r.creds, [2]string{access, secret})
	}
	return r, nil
}

func (r *rapyd) mac(c [2]string, salt, ts string, body []byte) []byte {
	m := hmac.New(sha256.New, []byte(c[1]))
	m.Write([]byte(r.url + salt + ts + c[0] + c[1]))
	m.Write(body)
	out := make([]byte, hex.EncodedLen(sha256.Size))
	hex.Encode(out, m.Sum(nil))
	return out
}

func (r *rapyd) Verify(body []byte, h http.Header) error {
	sig, err := oneValue(h, "signature")
	if err != nil {
		return err
	}
	salt, err := oneValue(h, "salt")
	if err != nil {
		return err
	}
	ts, err := oneValue(h, "timestamp")
	if err != nil {
		return err
	}
	got, err := base64.StdEncoding.DecodeString(sig)
	if err != nil || len(got) != hex.EncodedLen(sha256.Size) {
		return fmt.Errorf("header signature is not base64 of a hex SHA-256 digest: %w", ErrMalformedHeader)
	}
	if err := checkTimestamp(ts, time.Second, r.tolerance, r.now()); err != nil {
		return err
	}
	for _, c := range r.creds {
		if hmac.Equal(r.mac(c, salt, ts, body), got) {
			return nil
		}
	}
	return fmt.Errorf("header signature matches none of %d key pair(s): %w", len(r.creds), ErrNoMatchingSignature)
}

func (r *rapyd) sign(body []byte, h http.Header, ts time.Time) error {
	seed := sha256.Sum256(body)
	salt := hex.EncodeToString(seed[:6])
	tsText := strconv.FormatInt(ts.Unix(), 10)
	h.Set("salt", salt)
	h.Set("timestamp", tsText)
	h.Set("signature", base64.StdEncoding.EncodeToString(r.mac(r.creds[0], salt, tsText, body)))
	return nil
}

// braintree verifies Braintree's signed form as the braintree library's
// WebhookNotificationGateway does: the first bt_signature pair naming a
// configured public key must be the HMAC of bt_payload (or of bt_payload
// and a newline), and bt_payload holds only base64 characters and
// newlines.
type braintree struct {
	pairs []braintreeKey
}

type braintreeKey struct {
	public  string
	private string
}

var (
	braintreeChallenge = regexp.MustCompile(`^[a-f0-9]{20,32}$`)
	braintreePayload   = regexp.MustCompile(`^[A-Za-z0-9+=/\n]+$`)
)

// braintreeDigest is hex HMAC-SHA1 keyed with SHA-1(private key).
func braintreeDigest(private string, data []byte) string {
	k := sha1.Sum([]byte(private)) //nolint:gosec // Braintree's scheme
	m := hmac.New(sha1.New, k[:])
	m.Write(data)
	return hex.EncodeToString(m.Sum(nil))
}

func buildBraintree(_ Preset, o Options) (signer, error) {
	b := &braintree{}
	for i, s := range o.Secrets {
		pub, priv, ok := strings.Cut(s, ":")
		if !ok || pub == "" || priv == "" {
			return nil, fmt.Errorf("secret %d: write a Braintree key pair as <public key>:<private key>", i+1)
		}
		b.pairs = append(b.pairs, braintreeKey{pub, priv})
	}
	return b, nil
}

// braintreeCovers is Preset.Covered of Braintree: bt_payload without its
// trailing newlines, which the signature verifies with or without one.
func braintreeCovers(body []byte, _ http.Header) []byte {
	if _, payload, err := braintreeForm(body); err == nil {
		return []byte("bt_payload:" + strings.TrimRight(payload, "\n"))
	}
	return body
}

// braintreeForm reads bt_signature and bt_payload, each given once.
func braintreeForm(body []byte) (sig, payload string, err error) {
	vals, err := url.ParseQuery(string(body))
	if err != nil {
		return "", "", fmt.Errorf("body is not form-encoded: %w", ErrBodyNotForm)
	}
	get := func(name string) (string, error) {
		switch vs := vals[name]; len(vs) {
		case 0:
			return "", fmt.Errorf("form field %s: %w", name, ErrMissingHeader)
		case 1:
			if vs[0] == "" {
				return "", fmt.Errorf("form field %s is empty: %w", name, ErrMalformedHeader)
			}
			return vs[0], nil
		default:
			return "", fmt.Errorf("form field %s given %d times: %w", name, len(vs), ErrMalformedHeader)
		}
	}
	if sig, err = get("bt_signature"); err != nil {
		return "", "", err
	}
	if payload, err = get("bt_payload"); err != nil {
		return "", "", err
	}
	return sig, payload, nil
}

func (b *braintree) Verify(body []byte, _ http.Header) error {
	sig, payload, err := braintreeForm(body)
	if err != nil {
		return err
	}
	if !braintreePayload.MatchString(payload) {
		return fmt.Errorf("bt_payload holds characters other than base64 and newlines: %w", ErrMalformedHeader)
	}
	var pairs [][2]string
	for p := range strings.SplitSeq(sig, "&") {
		if pub, rest, ok := strings.Cut(p, "|"); ok {
			s, _, _ := strings.Cut(rest, "|")
			pairs = append(pairs, [2]string{pub, s})
		}
	}
	named := 0
	for _, k := range b.pairs {
		for _, p := range pairs {
			if p[0] != k.public {
				continue
			}
			named++
			for _, data := range []string{payload, payload + "\n"} {
				want := braintreeDigest(k.private, []byte(data))
				if subtle.ConstantTimeCompare([]byte(want), []byte(p[1])) == 1 {
					return nil
				}
			}
			break // the library checks the first pair naming the key only
		}
	}
	if named == 0 {
		return fmt.Errorf("bt_signature names none of %d configured public key(s): %w", len(b.pairs), ErrNoMatchingSignature)
	}
	return fmt.Errorf("bt_signature does not match bt_payload: %w", ErrNoMatchingSignature)
}

// signBody returns the form Braintree would post for a notification:
// body, if it is not already a form with bt_payload, is the notification
// itself and becomes bt_payload (base64).
func (b *braintree) signBody(body []byte, _ time.Time) ([]byte, error) {
	payload := base64.StdEncoding.EncodeToString(body)
	if vals, err := url.ParseQuery(string(body)); err == nil && vals.Get("bt_payload") != "" {
		payload = vals.Get("bt_payload")
	}
	k := b.pairs[0]
	return []byte(url.Values{
		"bt_signature": {k.public + "|" + braintreeDigest(k.private, []byte(payload))},
		"bt_payload":   {payload},
	}.Encode()), nil
}

func (b *braintree) sign([]byte, http.Header, time.Time) error {
	return errors.New("braintree signs a form body: use SignDelivery")
}
