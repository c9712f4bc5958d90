package signature_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
)

// Vectors of presets no official library verifies, computed outside Go
// (node:crypto) from each provider's documented formula over the example
// payloads of its documentation, plus the test vector of Lithic's own Go
// SDK. They pin the schemes independently of this package's Sign code. Each
// must verify, and the same delivery with one byte more in the body must not
// (except Postmark's, whose credentials cover no byte of the body).
func TestDocumentedFormulaVectors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, provider, secret, url, body string
		now                               int64
		header                            map[string]string
	}{
		{
			// The page's own example: secret, payload and expected signature.
			name: "coinify: docs signature example", provider: "coinify", secret: "my-shared-secret",
			body:   `{"examplePayload":true}`,
			header: map[string]string{"X-Coinify-Webhook-Signature": "bcdbb89e3031905f3cc1a20d16b5f969a17a7d8fa0c26e4a807c2193402d66f4"},
		},
		{
			name: "moonpay: docs steps (t from the docs' header example), documented formula", provider: "moonpay", secret: "moonpay-docs-webhook-key", now: 1492774577,
			body:   `{"type":"transaction_updated","data":{"id":"354b1f46-480c-4307-9896-f4c81c1e1e17","status":"completed","baseCurrencyAmount":1000}}`,
			header: map[string]string{"Moonpay-Signature-V2": "t=1492774577,s=0d20f805128561edc82d7ec8d6a19150b7c3901e607b4b80106664dbd8a63466"},
		},
		{
			name: "jira: secure admin webhooks (WebSub sha256=), documented formula", provider: "jira", secret: "jira-docs-secret",
			body:   `{"timestamp":1764547200000,"webhookEvent":"jira:issue_created","issue":{"id":"10002","key":"PAY-1"}}`,
			header: map[string]string{"X-Hub-Signature": "sha256=f9aa63028f02122220f708f63b47be2472b378259dfd7f760eb5e0cb0354ffc5", "X-Atlassian-Webhook-Identifier": "1234-docs"},
		},
		{
			name: "zohopayments: docs steps (t from the docs' sample header), documented formula", provider: "zohopayments", secret: "zoho-docs-signing-key", now: 1734340423,
			body:   `{"id":"pay_docs_1","status":"success","amount":1000}`,
			header: map[string]string{"X-Zoho-Webhook-Signature": "t=1734340423138,v=3c1a7f18fc371cf3b1f7e0a32d9552b613e149b4f1c6a08b659f7f3fd125cdc9"},
		},
		{
			name: "segment: docs Page call, documented formula", provider: "segment", secret: "segment-docs-shared-secret",
			body:   `{"version":1,"type":"page","userId":"019mr8mf4r","properties":{"path":"/pricing","referrer":"https://segment.com","title":"Segment Pricing","url":"https://segment.com/pricing"},"timestamp":"2012-12-02T00:30:08.276Z","messageId":"ajs-RT-docs"}`,
			header: map[string]string{"X-Signature": "5ea94f00e42341899b73bd3a0f37c6120a5498bf"},
		},
		{
			name: "clickup: docs example request, documented formula", provider: "clickup", secret: "clickup-docs-secret",
			body:   `{"webhook_id":"7689a169-a000-4985-8676-6902b96d6627","event":"taskCreated","task_id":"c0j"}`,
			header: map[string]string{"X-Signature": "c3ea80370e28517edac0ee3225228e717210f46834780d78356efcbc13901d3f"},
		},
		{
			name: "zendesk: docs example secret, body and timestamp, timestamp then body", provider: "zendesk", secret: "HRkRd4BeOAoUkfZr-mhauJT64rvBASlJRoIyPsd3zeA=", now: 1627207200,
			body:   `{"say": "hello"}`,
			header: map[string]string{"X-Zendesk-Webhook-Signature": "Rry/4TtIdFyawtXXp8QdI6tlAUUQ/5kL1OTp5qo/ZIk=", "X-Zendesk-Webhook-Signature-Timestamp": "2021-07-25T10:00:00Z"},
		},
		{
			name: "launchdarkly: docs sample payload, documented formula", provider: "launchdarkly", secret: "ld-docs-secret",
			body:   `{"_id":"57c0a8e29969090743529965","date":1472243938774,"accesses":[{"action":"updateName","resource":"proj/alexis:env/test"}],"kind":"environment","name":"Testing"}`,
			header: map[string]string{"X-LD-Signature": "0d1927304b10716021b4d3b10f2362cf32646c9c300483b535ce6c4e8cdf2783"},
		},
		{
			name: "attio: documented formula", provider: "attio", secret: "attio-docs-secret",
			body:   `{"webhook_id":"e0bb6e05-3f5a-4e4f-9c1a-8c0f7a8b2c11","events":[{"event_type":"note.created","id":{"workspace_id":"w1","note_id":"n1"}}]}`,
			header: map[string]string{"Attio-Signature": "8f64a7a271b240452240b0dd9bf7da492b72e2c629abc806512822ce0feab96d", "Idempotency-Key": "9d2f1c1e-docs"},
		},
		{
			name: "helpscout: docs PHP formula (base64 HMAC-SHA1)", provider: "helpscout", secret: "my-secret-key",
			body:   `{"id":12345,"number":42,"subject":"Refund","status":"active"}`,
			header: map[string]string{"X-HelpScout-Signature": "cvYy7JEhjwrNl/ME3vuxK0omZwc="},
		},
		{
			name: "aftership: documented formula", provider: "aftership", secret: "aftership-docs-secret",
			body:   `{"event":"tracking_update","event_id":"0b8b1d8e-8f2a-4c4e-9a8d-3f2b9d3e6a10","msg":{"tracking_number":"1Z0000000000000000","tag":"InTransit"},"ts":1764547200}`,
			header: map[string]string{"aftership-hmac-sha256": "hgGS19zvqCtUNJvoJhy3NMS6Zyx9El8hz/5FY5gyCXo="},
		},
		{
			name: "mandrill: docs steps (URL + sorted POST variables, base64 HMAC-SHA1)", provider: "mandrill", secret: "mandrill-docs-key", url: "https://hooks.example.test/mandrill",
			body:   `mandrill_events=%5B%7B%22event%22%3A%22send%22%2C%22_id%22%3A%22docs-1%22%2C%22ts%22%3A1764547200%7D%5D`,
			header: map[string]string{"X-Mandrill-Signature": "o00INZvdzuUgxbA7/MvkGPWt0uQ=", "Content-Type": "application/x-www-form-urlencoded"},
		},
		{
			name: "postmark: Basic credentials of https://user:pass@host/", provider: "postmark", secret: "hook:s3cr3t",
			body:   `{"RecordType":"Delivery","MessageID":"docs-1"}`,
			header: map[string]string{"Authorization": "Basic aG9vazpzM2NyM3Q="},
		},
		{
			name: "lithic: lithic-go TestVerifySignature vector", provider: "lithic", secret: "whsec_zlFsbBZ8Xcodlpcu6NDTdSzZRLSdhkst", now: 1676312382,
			body:   `{"card_token":"sit Lorem ipsum, accusantium repellendus possimus","created_at":"elit. placeat libero architecto molestias, sit","account_token":"elit.","issuer_decision":"magnam, libero esse Lorem ipsum magnam, magnam,","tokenization_attempt_id":"illum dolor repellendus libero esse accusantium","wallet_decisioning_info":{"device_score":"placeat architecto"},"digital_wallet_token_metadata":{"status":"reprehenderit dolor","token_requestor_id":"possimus","payment_account_info":{"account_holder_data":{"phone_number":"libero","email_address":"nobis molestias, veniam culpa! quas elit. quas libero esse architecto placeat"},"pan_unique_reference":"adipisicing odit magnam, odit"}}}`,
			header: map[string]string{"webhook-id": "msg_2Lh9KRb0pzN4LePd3XiA4v12Axj", "webhook-timestamp": "1676312382", "webhook-signature": "v1,Dwa0AHInLL3XFo2sxcHamOQDrJNi7F654S3L6skMAOI="},
		},
	}
	covered := map[string]bool{}
	for _, tc := range cases {
		covered[tc.provider] = true
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			at := time.Unix(tc.now, 0)
			if tc.now == 0 {
				at = now
			}
			v, err := signature.New(tc.provider, signature.Options{Secrets: []string{tc.secret}, URL: tc.url, Now: clock(at)})
			require.NoError(t, err)
			h := http.Header{}
			for k, val := range tc.header {
				h.Set(k, val)
			}
			require.NoError(t, v.Verify([]byte(tc.body), h))
			if tokenLike[tc.provider] {
				return
			}
			require.ErrorIs(t, v.Verify([]byte(tc.body+" "), h), signature.ErrNoMatchingSignature)
		})
	}
	// Every documentation-only preset of issue 25 has one.
	for _, name := range []string{"zendesk", "segment", "clickup", "attio", "launchdarkly", "helpscout", "aftership", "mandrill", "postmark", "coinify", "moonpay", "jira", "zohopayments"} {
		p, ok := signature.Lookup(name)
		require.True(t, ok, name)
		require.Empty(t, p.Oracle, name)
		require.True(t, covered[name], name)
	}
}
