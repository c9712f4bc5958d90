package signature

import (
	"crypto/hmac"
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"time"
)

// GitLab sends the webhook's secret token itself in X-Gitlab-Token: there is
// no HMAC, so the engine cannot express it and this file compares the token
// with every configured secret in constant time (over SHA-256 digests, so
// the length does not leak either).
//
// Idempotency-Key (GitLab 17.4+) stays the same across retries of one event;
// X-Gitlab-Event-UUID is the fallback. Neither is signed and there is no
// timestamp, hence DedupeBody.
func init() {
	register(Preset{
		Name: "gitlab",
		Delivery: Delivery{
			// The document says 25 MB: read as MiB, the larger reading, so
			// no delivery GitLab sends is over it.
			MaxBody: MaxBody{Bytes: 25 << 20, Note: "25 MB, GitLab's instance limit", Source: "https://docs.gitlab.com/administration/instance_limits/#webhook-payload-size"},
			Retry:   Retry{Retries: true, Note: "the document only says a slow hook may be retried; a hook failing 4 times in a row is disabled (4xx until re-enabled by hand, 5xx for 1 minute up to 24 hours)", Source: "https://docs.gitlab.com/user/project/integrations/webhooks/"},
			Timeout: Timeout{Duration: 10 * time.Second, Note: "GitLab.com; configurable on self-managed", Source: "https://docs.gitlab.com/user/gitlab_com/"},
			Answer:  Answer{Note: "as fast as possible", Source: "https://docs.gitlab.com/user/project/integrations/webhooks/"},
			Refusal: Refusal{Note: "a 4xx disables the hook until it is re-enabled by hand", Source: "https://docs.gitlab.com/user/project/integrations/webhooks/"},
		},
		Doc:             "https://docs.gitlab.com/user/project/integrations/webhooks/#create-a-webhook",
		SignatureHeader: "X-Gitlab-Token: <secret token>",
		EventID:         ids(headerID("Idempotency-Key"), headerID("X-Gitlab-Event-UUID")),
		DedupeBody:      true,
		IDStability:     StabilityStable, // Idempotency-Key: consistent across retries
		Scheme: Scheme{
			Headers: []HeaderSet{{Signature: "X-Gitlab-Token"}},
			Signed:  "none: the secret token is sent as is",
		},
		build: func(p Preset, o Options) (signer, error) {
			v := &tokenVerifier{header: p.Headers[0].Signature}
			for _, s := range o.Secrets {
				d := sha256.Sum256([]byte(s))
				v.digests = append(v.digests, d[:])
			}
			v.first = o.Secrets[0]
			return v, nil
		},
	})
}

// tokenVerifier checks a plain shared token carried in a header.
type tokenVerifier struct {
	header  string
	digests [][]byte
	first   string
}

func (v *tokenVerifier) Verify(_ []byte, h http.Header) error {
	token, err := oneValue(h, v.header)
	if err != nil {
		return err
	}
	d := sha256.Sum256([]byte(token))
	for _, want := range v.digests {
		if hmac.Equal(d[:], want) {
			return nil
		}
	}
	return fmt.Errorf("header %s matches none of %d secret(s): %w", v.header, len(v.digests), ErrNoMatchingSignature)
}

// VerifyReader implements StreamVerifier: the token binds no body, so the
// body is only read to its end (a read error is returned as is).
func (v *tokenVerifier) VerifyReader(body io.Reader, h http.Header) error {
	if err := v.Verify(nil, h); err != nil {
		return err
	}
	_, err := io.Copy(io.Discard, body)
	return err
}

func (v *tokenVerifier) sign(_ []byte, h http.Header, _ time.Time) error {
	h.Set(v.header, v.first)
	return nil
}
