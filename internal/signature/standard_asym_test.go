package signature_test

import (
	"crypto/ed25519"
	"encoding/base64"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
)

// Standard Webhooks v1a (Ed25519) signatures, computed from the spec with
// crypto/ed25519 (the Go reference library implements only v1).
func TestStandardAsymmetric(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_764_547_200, 0)
	clock := func() time.Time { return now }
	seed := make([]byte, 32)
	for i := range seed {
		seed[i] = byte(i)
	}
	priv := ed25519.NewKeyFromSeed(seed)
	whsk := "whsk_" + base64.StdEncoding.EncodeToString(priv)
	whpk := "whpk_" + base64.StdEncoding.EncodeToString(priv.Public().(ed25519.PublicKey))
	otherPub := "whpk_" + base64.StdEncoding.EncodeToString(ed25519.NewKeyFromSeed(make([]byte, 32)).Public().(ed25519.PublicKey))
	hmacSecret := "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	body := []byte(`{"type":"user.created","data":{"id":"user_BR12"}}`)

	signed := func(secret string, ts time.Time) http.Header {
		h := http.Header{}
		h.Set("webhook-id", "msg_asym_1")
		require.NoError(t, signature.Sign("standard", signature.Options{Secrets: []string{secret}}, body, h, ts))
		return h
	}
	verify := func(h http.Header, b []byte, secrets ...string) error {
		v, err := signature.New("standard", signature.Options{Secrets: secrets, Now: clock})
		require.NoError(t, err)
		return v.Verify(b, h)
	}

	v1a := signed(whsk, now)
	require.Contains(t, v1a.Get("webhook-signature"), "v1a,")
	require.NoError(t, verify(v1a, body, whpk))
	require.NoError(t, verify(v1a, body, hmacSecret, otherPub, whpk), "mixed rotation")
	require.ErrorIs(t, verify(v1a, body, otherPub), signature.ErrNoMatchingSignature)
	require.ErrorIs(t, verify(v1a, []byte(`{"tampered":true}`), whpk), signature.ErrNoMatchingSignature)
	require.ErrorIs(t, verify(signed(whsk, now.Add(-10*time.Minute)), body, whpk), signature.ErrTimestampOutOfTolerance)
	require.ErrorIs(t, verify(signed(whsk, now.Add(10*time.Minute)), body, whpk), signature.ErrTimestampOutOfTolerance)
	// v1a only, route with a symmetric secret: fail closed (BR-12 c).
	require.ErrorIs(t, verify(v1a, body, hmacSecret), signature.ErrMalformedHeader, "no usable v1 entry")
	// v1 signature with a public-key-only route: fail closed.
	require.ErrorIs(t, verify(signed(hmacSecret, now), body, whpk), signature.ErrNoMatchingSignature)
	// Both kinds in one header, each route checks what it can.
	both := signed(hmacSecret, now)
	both.Set("webhook-signature", v1a.Get("webhook-signature")+" "+both.Get("webhook-signature"))
	require.NoError(t, verify(both, body, whpk))
	require.NoError(t, verify(both, body, hmacSecret, whpk))
	// The ID is signed.
	moved := signed(whsk, now)
	moved.Set("webhook-id", "msg_other")
	require.ErrorIs(t, verify(moved, body, whpk), signature.ErrNoMatchingSignature)

	_, err := signature.New("standard", signature.Options{Secrets: []string{"whpk_not-base64"}})
	require.ErrorContains(t, err, "whpk_")
}
