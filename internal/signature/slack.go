package signature

import (
	"net/http"
	"time"
)

// Slack: X-Slack-Signature: v0=<hex>, HMAC-SHA256 of "v0:<ts>:<body>" with
// X-Slack-Request-Timestamp. The body may be JSON (Events API) or a form
// (slash commands, interactivity); it is hashed raw either way.
//
// url_verification requests are handshakes: verified, then forwarded every
// time without a claim.
func init() {
	register(Preset{
		Name: "slack",
		Delivery: Delivery{
			Retry:   Retry{Retries: true, Attempts: 4, Note: "3 retries: at once, after 1 minute, after 5 minutes; X-Slack-No-Retry: 1 on an error answer stops them", Source: "https://docs.slack.dev/apis/events-api/#retries"},
			Timeout: Timeout{Duration: 3 * time.Second, Source: "https://docs.slack.dev/apis/events-api/#retries"},
			Answer:  Answer{Note: "within 3 seconds", Source: "https://docs.slack.dev/apis/events-api/#retries"},
			MaxBody: MaxBody{Source: Undocumented},
			Refusal: Refusal{Source: Undocumented},
		},
		Doc:              "https://docs.slack.dev/authentication/verifying-requests-from-slack",
		SignatureHeader:  "X-Slack-Signature: v0=<hex> (with X-Slack-Request-Timestamp)",
		DefaultTolerance: 5 * time.Minute,
		EventID:          ids(jsonID("event_id")),
		IDStability:      StabilityStable,
		Oracle:           "@slack/bolt",
		Challenges: []Challenge{{
			Name: "url_verification", Method: http.MethodPost,
			BodyField: "type", BodyValue: "url_verification",
			Auth: AuthSignature, Answer: AnswerJSON, Echo: "json challenge", JSONKey: "challenge",
		}},
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "X-Slack-Signature", Timestamp: "X-Slack-Request-Timestamp"}},
			Format:    Format{Prefix: "v0="},
			Signed:    "v0:{timestamp}:{body}",
			Algorithm: "sha256",
			Encoding:  "hex",
		},
	})
}
