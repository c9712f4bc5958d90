package signature_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
)

// Known-answer vectors published in the providers' own documentation,
// verified (not signed) by our verifiers. They pin the schemes independently
// of our Sign code.
func TestProviderDocumentationVectors(t *testing.T) {
	t.Parallel()
	slackBody := "token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c"
	cases := []struct {
		name, provider, secret, body string
		now                          int64
		header                       map[string]string
	}{
		{
			// docs.github.com "Validating webhook deliveries", testing the payload validation.
			name: "github docs", provider: "github", secret: "It's a Secret to Everybody", body: "Hello, World!",
			header: map[string]string{"X-Hub-Signature-256": "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"},
		},
		{
			// api.slack.com "Verifying requests from Slack", the step-by-step walk-through.
			name: "slack docs", provider: "slack", secret: "8f742231b10e8888abcd99yyyzzz85a5", body: slackBody, now: 1531420618,
			header: map[string]string{
				"X-Slack-Request-Timestamp": "1531420618",
				"X-Slack-Signature":         "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503",
			},
		},
		{
			// docs.svix.com "Verifying payloads manually" and the Standard Webhooks libraries' tests.
			name: "standard webhooks docs", provider: "standard", secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
			body: `{"test": 2432232314}`, now: 1614265330,
			header: map[string]string{
				"webhook-id":        "msg_p5jXN8AQM9LWM0D4loKWxJek",
				"webhook-timestamp": "1614265330",
				"webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
			},
		},
		{
			name: "svix docs", provider: "svix", secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
			body: `{"test": 2432232314}`, now: 1614265330,
			header: map[string]string{
				"svix-id":        "msg_p5jXN8AQM9LWM0D4loKWxJek",
				"svix-timestamp": "1614265330",
				"svix-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			now := time.Unix(tc.now, 0)
			v, err := signature.New(tc.provider, signature.Options{Secrets: []string{tc.secret}, Now: func() time.Time { return now }})
			require.NoError(t, err)
			h := http.Header{}
			for k, val := range tc.header {
				h.Set(k, val)
			}
			require.NoError(t, v.Verify([]byte(tc.body), h))
			require.ErrorIs(t, v.Verify([]byte(tc.body+" "), h), signature.ErrNoMatchingSignature)
		})
	}
}
