package cli_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/cli"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
)

// TestSecretHeadersNameEveryHeaderAVerifierTakes: a header the verifier
// accepts a signature or credential in is one the log filter deletes. An
// adversarial trial found Plivo's X-Plivo-Signature-Ma-V3 printed by
// reverse_proxy's debug line through the generated filter; Box's secondary
// signature and Adyen's Basic credentials were missing too.
func TestSecretHeadersNameEveryHeaderAVerifierTakes(t *testing.T) {
	t.Parallel()
	at := time.Unix(1_764_547_200, 0)
	for _, tc := range []struct {
		provider, secret, url, body, from, to string
		contentType                           string
	}{
		{"plivo", "plivo_token", "https://hooks.example.test/plivo", "CallUUID=c1&From=1&To=2",
			"X-Plivo-Signature-V3", "X-Plivo-Signature-Ma-V3", "application/x-www-form-urlencoded"},
		{"box", "box_primary_key", "", `{"id":"b1","trigger":"FILE.UPLOADED"}`,
			"Box-Signature-Primary", "Box-Signature-Secondary", "application/json"},
	} {
		t.Run(tc.provider, func(t *testing.T) {
			t.Parallel()
			o := signature.Options{Secrets: []string{tc.secret}, URL: tc.url, Now: func() time.Time { return at }}
			h := http.Header{"Content-Type": {tc.contentType}}
			require.NoError(t, signature.Sign(tc.provider, o, []byte(tc.body), h, at))
			h.Set(tc.to, h.Get(tc.from))
			h.Del(tc.from)
			v, err := signature.New(tc.provider, o)
			require.NoError(t, err)
			require.NoError(t, v.Verify([]byte(tc.body), h), "the verifier takes the signature in %s", tc.to)
			hs, err := cli.SecretHeaders([]string{tc.provider})
			require.NoError(t, err)
			require.Contains(t, hs, tc.to)
		})
	}
	// Adyen's Basic credentials are a configured secret ("basic:user:pass").
	hs, err := cli.SecretHeaders([]string{"adyen"})
	require.NoError(t, err)
	require.Contains(t, hs, "Authorization")
}
