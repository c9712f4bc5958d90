package caddymodule

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// A correctly signed body the scheme refuses is answered with the real
// reason, "body is not JSON", counted bad_request, and never forwarded; the
// same body under a wrong secret still gets "no matching signature", so the
// reason tells a prober nothing about the secret.
func TestSignedBodyNotJSONNamesTheReason(t *testing.T) {
	t.Parallel()
	secret := "whsec_" + randomHex(8)
	g := newGateway(t, "webhook_idempotency {\n provider stripe\n secret "+secret+"\n scope "+uniqueScope("notjson")+"\n}")
	now := g.clock.Unix()
	for _, body := range []string{"not json", "", `["a"]`, `{"id":"evt_1"`} {
		a := g.serve(g.stripe(secret, []byte(body), now))
		requireRefused(t, a, http.StatusBadRequest, `"body is not JSON"`)
		a = g.serve(g.stripe("whsec_wrong_"+randomHex(4), []byte(body), now))
		requireRefused(t, a, http.StatusBadRequest, `"no matching signature"`)
	}
	require.Equal(t, 0, g.up.count())
	require.Empty(t, g.rows())
	require.Equal(t, 4.0, g.outcomes(outcomeBadRequest))
	require.Equal(t, 4.0, g.outcomes(outcomeInvalidSignature))
}

// Twilio signs the form's parameters: a body that is not a form cannot be
// verified at all, and the answer says so instead of blaming the signature.
func TestTwilioBodyNotFormNamesTheReason(t *testing.T) {
	t.Parallel()
	g := newGateway(t, "webhook_idempotency {\n provider twilio\n secret tw_"+randomHex(4)+"\n url https://hooks.example.test/tw\n}")
	req := newDelivery("http://gateway.test/tw", []byte("a=%zz"), "Content-Type", "application/x-www-form-urlencoded",
		"I-Twilio-Idempotency-Token", "idem-1", "X-Twilio-Signature", b64Of(make([]byte, 20)))
	requireRefused(t, g.serve(req), http.StatusBadRequest, `"body is not a form"`)
	require.Equal(t, 0, g.up.count())
}
