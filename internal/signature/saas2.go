package signature

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Support desks, analytics, content and collaboration platforms beyond
// saas.go. Each is data for the generic engine.
func init() {
	// Zendesk: base64 HMAC-SHA256 of the timestamp header (RFC 3339, e.g.
	// 2021-03-25T05:09:27Z) followed by the body, per "Verifying webhook
	// authenticity" (an older copy of that page showed body then timestamp;
	// the current text and the anatomy page say timestamp then body).
	// Zendesk documents no tolerance, so the five minutes every timestamped
	// preset uses apply. Event-subscription payloads carry an id;
	// trigger and automation payloads are the user's, so configure one there.
	register(Preset{
		Name: "zendesk",
		Delivery: Delivery{
			Retry:   Retry{Retries: true, Note: "retries requests that fail with certain status codes; a circuit breaker pauses a webhook whose requests keep failing", Source: "https://developer.zendesk.com/api-reference/webhooks/introduction/#webhook-retries"},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Source: Undocumented},
			Answer:  Answer{Source: Undocumented},
			Refusal: Refusal{Source: Undocumented},
		},
		Doc:              "https://developer.zendesk.com/documentation/webhooks/verifying/",
		SignatureHeader:  "X-Zendesk-Webhook-Signature: <base64> (with X-Zendesk-Webhook-Signature-Timestamp, RFC 3339)",
		DefaultTolerance: 5 * time.Minute,
		EventID:          ids(jsonID("id")),
		Scheme: Scheme{
			Headers:         []HeaderSet{{Signature: "X-Zendesk-Webhook-Signature", Timestamp: "X-Zendesk-Webhook-Signature-Timestamp"}},
			Signed:          "{timestamp}{body}",
			Algorithm:       "sha256",
			Encoding:        "base64",
			TimestampLayout: time.RFC3339Nano,
		},
	})
	// Segment (Webhooks destination, Classic and Actions): X-Signature, the
	// hex HMAC-SHA1 of the body under the destination's shared secret.
	// messageId is Segment's per-message ID. Segment signs only the first
	// event of a batched Actions request, so batching must stay off: a batch
	// never verifies here.
	register(Preset{
		Name: "segment",
		Delivery: Delivery{
			Retry:   Retry{Retries: true, Note: "a timed-out event is retried later", Source: "https://segment.com/docs/connections/destinations/catalog/webhooks/#webhooks-timeouts"},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Duration: 5 * time.Second, Source: "https://segment.com/docs/connections/destinations/catalog/webhooks/#webhooks-timeouts"},
			Answer:  Answer{Source: Undocumented},
			Refusal: Refusal{Source: Undocumented},
		},
		Doc:             "https://segment.com/docs/connections/destinations/catalog/actions-webhook/",
		SignatureHeader: "X-Signature: <hex>",
		EventID:         ids(jsonID("messageId")),
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "X-Signature"}},
			Signed:    "{body}",
			Algorithm: "sha1",
			Encoding:  "hex",
		},
	})
	// ClickUp: X-Signature, the hex HMAC-SHA256 of the body under the
	// webhook's secret. Payloads carry no event ID: configure one.
	register(Preset{
		Name: "clickup",
		Delivery: Delivery{
			Retry:   Retry{Retries: true, Attempts: 5, Note: "then the event is dropped and fail_count grows; 100 failures suspend the webhook, a 410 suspends it at once; failed events are never resent", Source: "https://developer.clickup.com/docs/webhookhealth"},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Duration: 7 * time.Second, Source: "https://developer.clickup.com/docs/webhookhealth"},
			Answer:  Answer{Note: "a successful status in a timely manner", Source: "https://developer.clickup.com/docs/webhookhealth"},
			Refusal: Refusal{Note: "counts as a failure toward the 100 that suspend the webhook", Source: "https://developer.clickup.com/docs/webhookhealth"},
		},
		Doc:             "https://developer.clickup.com/docs/webhooksignature",
		SignatureHeader: "X-Signature: <hex>",
		DedupeBody:      true,
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "X-Signature"}},
			Signed:    "{body}",
			Algorithm: "sha256",
			Encoding:  "hex",
		},
	})
	// Sanity GROQ-powered webhooks: "t=<ms>,v1=<base64url>" over
	// "<t>.<body>" (the official @sanity/webhook toolkit). The toolkit does
	// not bound the timestamp's age; this preset does (five minutes). The
	// payload is the user's GROQ projection: configure an event ID.
	register(Preset{
		Name: "sanity",
		Delivery: Delivery{
			Retry:   Retry{Retries: true, For: time.Minute, Attempts: 3, Note: "only 429 and 5xx are retried, twice, 30 s apart", Source: "https://www.sanity.io/docs/changelog/50ec6abf-fe0c-475b-ae72-314148860132"},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Source: Undocumented},
			Answer:  Answer{Source: Undocumented},
			Refusal: Refusal{Note: "a 4xx other than 429 is not retried", Source: "https://www.sanity.io/docs/changelog/50ec6abf-fe0c-475b-ae72-314148860132"},
		},
		Doc:              "https://github.com/sanity-io/webhook-toolkit#readme",
		SignatureHeader:  "sanity-webhook-signature: t=<ms>,v1=<base64url>",
		DefaultTolerance: 5 * time.Minute,
		Oracle:           "@sanity/webhook",
		Scheme: Scheme{
			Headers:       []HeaderSet{{Signature: "sanity-webhook-signature"}},
			Format:        Format{List: ",", Pair: "=", SigKey: "v1", TimestampKey: "t"},
			Signed:        "{timestamp}.{body}",
			Algorithm:     "sha256",
			Encoding:      "base64url",
			TimestampUnit: time.Millisecond,
		},
	})
	// Liveblocks and Lithic deliver through Svix with the webhook-* headers
	// of Standard Webhooks and whsec_ secrets.
	liveblocks := standardBased("liveblocks", "https://liveblocks.io/docs/platform/webhooks", "whsec", "@liveblocks/node")
	liveblocks.Delivery = Delivery{
		Retry:   Retry{Retries: true, Note: "a non-2xx answer is retried; an endpoint failing every delivery for 5 consecutive days is disabled", Source: "https://liveblocks.io/docs/platform/webhooks"},
		MaxBody: MaxBody{Source: Undocumented},
		Timeout: Timeout{Source: Undocumented},
		Answer:  Answer{Note: "any 2xx (200-299)", Source: "https://liveblocks.io/docs/platform/webhooks"},
		Refusal: Refusal{Note: "retried like any non-2xx", Source: "https://liveblocks.io/docs/platform/webhooks"},
	}
	register(liveblocks)
	lithic := standardBased("lithic", "https://github.com/lithic-com/lithic-go/blob/main/webhook.go", "whsec", "lithic")
	lithic.Delivery = allUndocumented
	register(lithic)
	// Attio: Attio-Signature (duplicated as X-Attio-Signature), the hex
	// HMAC-SHA256 of the body under the webhook secret. Idempotency-Key is
	// the same across retries and redeliveries of one message, but unsigned
	// and without a timestamp, hence DedupeBody.
	register(Preset{
		Name: "attio",
		Delivery: Delivery{
			Retry:   Retry{Retries: true, For: 3 * 24 * time.Hour, Attempts: 11, Note: "up to 10 retries with exponential backoff over about 3 days; then the webhook is marked degraded", Source: "https://docs.attio.com/rest-api/how-to/webhooks"},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Source: Undocumented},
			Answer:  Answer{Note: "200 or 202", Source: "https://docs.attio.com/rest-api/how-to/webhooks"},
			Refusal: Refusal{Note: "retried like any answer other than 200 or 202", Source: "https://docs.attio.com/rest-api/how-to/webhooks"},
		},
		Doc:             "https://docs.attio.com/rest-api/how-to/webhooks",
		SignatureHeader: "Attio-Signature: <hex> (also X-Attio-Signature)",
		EventID:         ids(headerID("Idempotency-Key")),
		IDStability:     StabilityStable,
		DedupeBody:      true,
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "Attio-Signature"}, {Signature: "X-Attio-Signature"}},
			Signed:    "{body}",
			Algorithm: "sha256",
			Encoding:  "hex",
		},
	})
	// LaunchDarkly: X-LD-Signature, the hex HMAC-SHA256 of the payload
	// under the webhook's secret. The payload is an audit log entry; its
	// _id names it.
	register(Preset{
		Name: "launchdarkly",
		Delivery: Delivery{
			Retry:   Retry{Retries: true, Attempts: 2, Note: "one retry after a non-2xx answer; delivery is not guaranteed", Source: "https://launchdarkly.com/docs/home/infrastructure/webhooks"},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Source: Undocumented},
			Answer:  Answer{Source: "https://launchdarkly.com/docs/home/infrastructure/webhooks"},
			Refusal: Refusal{Note: "retried once like any non-2xx", Source: "https://launchdarkly.com/docs/home/infrastructure/webhooks"},
		},
		Doc:             "https://launchdarkly.com/docs/home/infrastructure/webhooks",
		SignatureHeader: "X-LD-Signature: <hex>",
		EventID:         ids(jsonID("_id")),
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "X-LD-Signature"}},
			Signed:    "{body}",
			Algorithm: "sha256",
			Encoding:  "hex",
		},
	})
	// Help Scout: X-HelpScout-Signature, the base64 HMAC-SHA1 of the body
	// under the webhook's secret key. Payloads are the changed object, with
	// no event ID: configure one.
	register(Preset{
		Name:            "helpscout",
		Delivery:        allUndocumented,
		Doc:             "https://developer.helpscout.com/webhooks/",
		SignatureHeader: "X-HelpScout-Signature: <base64>",
		DedupeBody:      true,
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "X-HelpScout-Signature"}},
			Signed:    "{body}",
			Algorithm: "sha1",
			Encoding:  "base64",
		},
	})
	// Jira Cloud admin webhooks saved with a secret (WebSub signatures):
	// X-Hub-Signature: sha256=<hex>, HMAC-SHA256 of the body. Webhooks that
	// apps register are not signed this way. X-Atlassian-Webhook-Identifier
	// names the delivery, unsigned and without a timestamp, hence DedupeBody.
	register(Preset{
		Name:            "jira",
		Delivery:        allUndocumented,
		Doc:             "https://developer.atlassian.com/cloud/jira/platform/webhooks/#secure-admin-webhooks",
		SignatureHeader: "X-Hub-Signature: sha256=<hex>",
		EventID:         ids(headerID("X-Atlassian-Webhook-Identifier")),
		DedupeBody:      true,
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "X-Hub-Signature"}},
			Format:    Format{Prefix: "sha256="},
			Signed:    "{body}",
			Algorithm: "sha256",
			Encoding:  "hex",
		},
	})
	// AfterShip Tracking: aftership-hmac-sha256, the base64 HMAC-SHA256 of
	// the body under the account's webhook secret. event_id (a UUID) names
	// the webhook event, per the webhook specifications
	// (https://www.aftership.com/docs/tracking/2025-01/webhook/webhook-specifications).
	register(Preset{
		Name: "aftership",
		Delivery: Delivery{
			Retry:   Retry{Retries: true, Note: "an unsuccessful event (a status outside 200-299) is retried", Source: "https://www.aftership.com/blog/aftership-introduces-webhook"},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Source: Undocumented},
			Answer:  Answer{Note: "a status in 200-299", Source: "https://www.aftership.com/blog/aftership-introduces-webhook"},
			Refusal: Refusal{Source: Undocumented},
		},
		Doc:             "https://www.aftership.com/docs/tracking/webhook/webhook-signature",
		SignatureHeader: "aftership-hmac-sha256: <base64>",
		EventID:         ids(jsonID("event_id")),
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "aftership-hmac-sha256"}},
			Signed:    "{body}",
			Algorithm: "sha256",
			Encoding:  "base64",
		},
	})
}

// Hygraph (GraphCMS): gcms-signature: "sign=<base64>, env=<environment>,
// t=<ms>", the base64 HMAC-SHA256 of the JSON text
// {"Body":<body as a JSON string>,"EnvironmentName":<env>,"TimeStamp":<t>}
// as JavaScript's JSON.stringify writes it (@hygraph/utils
// verifyWebhookSignature, which does not bound the timestamp's age; this
// preset allows five minutes). The engine cannot rebuild that text.
func init() {
	register(Preset{
		Name:             "hygraph",
		Delivery:         allUndocumented,
		Doc:              "https://www.npmjs.com/package/@hygraph/utils",
		SignatureHeader:  "gcms-signature: sign=<base64>, env=<environment>, t=<ms>",
		DefaultTolerance: 5 * time.Minute,
		Oracle:           "@hygraph/utils",
		Scheme: Scheme{
			Headers:       []HeaderSet{{Signature: "gcms-signature"}},
			Signed:        `{"Body":<{body} as a JSON string>,"EnvironmentName":<env>,"TimeStamp":<t>}`,
			Algorithm:     "sha256",
			Encoding:      "base64",
			TimestampUnit: time.Millisecond,
		},
		build: func(p Preset, o Options) (signer, error) {
			keys, err := decodeSecrets("raw", o.Secrets)
			if err != nil {
				return nil, err
			}
			tolerance, now := clock(p, o)
			return &hygraphVerifier{keys: keys, tolerance: tolerance, now: now}, nil
		},
	})
}

type hygraphVerifier struct {
	keys      [][]byte
	tolerance time.Duration
	now       func() time.Time
}

const hygraphHeader = "gcms-signature"

func (v *hygraphVerifier) Verify(body []byte, h http.Header) error {
	raw, err := oneValue(h, hygraphHeader)
	if err != nil {
		return err
	}
	parts := strings.Split(raw, ", ")
	if len(parts) != 3 || !strings.HasPrefix(parts[0], "sign=") || !strings.HasPrefix(parts[1], "env=") || !strings.HasPrefix(parts[2], "t=") {
		return fmt.Errorf("header %s is not sign=<base64>, env=<name>, t=<ms>: %w", hygraphHeader, ErrMalformedHeader)
	}
	b64 := codec{name: "base64", decode: base64.StdEncoding.Strict().DecodeString}
	sig, ok := b64.decodeDigest(strings.TrimPrefix(parts[0], "sign="), sha256.Size)
	if !ok {
		return fmt.Errorf("header %s does not hold a base64 digest of %d bytes: %w", hygraphHeader, sha256.Size, ErrMalformedHeader)
	}
	env, ts := strings.TrimPrefix(parts[1], "env="), strings.TrimPrefix(parts[2], "t=")
	if err := checkTimestamp(ts, time.Millisecond, v.tolerance, v.now()); err != nil {
		return err
	}
	msg := hygraphSigned(body, env, ts)
	for _, key := range v.keys {
		if hmac.Equal(hmacSum(sha256.New, key, msg), sig) {
			return nil
		}
	}
	return fmt.Errorf("%s: checked against %d secret(s): %w", hygraphHeader, len(v.keys), ErrNoMatchingSignature)
}

func (v *hygraphVerifier) sign(body []byte, h http.Header, ts time.Time) error {
	t := strconv.FormatInt(ts.UnixMilli(), 10)
	sig := base64.StdEncoding.EncodeToString(hmacSum(sha256.New, v.keys[0], hygraphSigned(body, "master", t)))
	h.Set(hygraphHeader, "sign="+sig+", env=master, t="+t)
	return nil
}

// hygraphSigned is the JSON text Hygraph signs. ts is decimal digits
// (checked before), so it is written as is, as the number JSON.stringify
// prints.
func hygraphSigned(body []byte, env, ts string) string {
	var b strings.Builder
	b.WriteString(`{"Body":`)
	jsString(&b, string(body))
	b.WriteString(`,"EnvironmentName":`)
	jsString(&b, env)
	b.WriteString(`,"TimeStamp":`)
	b.WriteString(strings.TrimLeft(ts, "0"))
	if strings.TrimLeft(ts, "0") == "" {
		b.WriteByte('0')
	}
	b.WriteByte('}')
	return b.String()
}

// jsString writes s as JavaScript's JSON.stringify quotes a string: ", \
// and control characters escaped (\b \f \n \r \t, else \u00xx), every other
// character as is (unlike encoding/json, which also escapes <, >, & and
// U+2028/U+2029). Invalid UTF-8 cannot come from a JavaScript string; it is
// written as U+FFFD, as a UTF-8 decoder would read it.
func jsString(b *strings.Builder, s string) {
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		default:
			if r < 0x20 {
				fmt.Fprintf(b, `\u%04x`, r)
				continue
			}
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
}
