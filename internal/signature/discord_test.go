package signature_test

import (
	"crypto/ed25519"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
)

// Vector computed from Discord's documentation (Ed25519 over timestamp +
// body), with a fixed seed; there is no official Go library to derive it.
func TestDiscord(t *testing.T) {
	t.Parallel()
	seed := "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60" // RFC 8032 test 1
	pub, err := signature.PublicSecret("discord", seed)
	require.NoError(t, err)
	require.Equal(t, "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a", pub)
	now := time.Unix(1_764_547_200, 0)
	clock := func() time.Time { return now }
	body := []byte(`{"type":2,"id":"1234567890","data":{"name":"pay"}}`)

	signed := func(ts time.Time, b []byte) http.Header {
		h := http.Header{}
		require.NoError(t, signature.Sign("discord", signature.Options{Secrets: []string{seed}}, b, h, ts))
		return h
	}
	other := hex.EncodeToString(ed25519.NewKeyFromSeed(make([]byte, 32)).Public().(ed25519.PublicKey))
	v, err := signature.New("discord", signature.Options{Secrets: []string{other, pub}, Now: clock})
	require.NoError(t, err)

	require.NoError(t, v.Verify(body, signed(now, body)), "valid, second key (rotation)")
	require.ErrorIs(t, v.Verify([]byte(`{"type":2,"id":"1234567891"}`), signed(now, body)), signature.ErrNoMatchingSignature)
	require.ErrorIs(t, v.Verify(body, signed(now.Add(-6*time.Minute), body)), signature.ErrTimestampOutOfTolerance)
	require.ErrorIs(t, v.Verify(body, signed(now.Add(6*time.Minute), body)), signature.ErrTimestampOutOfTolerance)
	h := signed(now, body)
	h.Del("X-Signature-Ed25519")
	require.ErrorIs(t, v.Verify(body, h), signature.ErrMissingHeader)
	h = signed(now, body)
	h.Set("X-Signature-Ed25519", "zz")
	require.ErrorIs(t, v.Verify(body, h), signature.ErrMalformedHeader)
	h = signed(now, body)
	h.Set("X-Signature-Timestamp", strconv.FormatInt(now.Unix()+1, 10)) // timestamp is signed
	require.ErrorIs(t, v.Verify(body, h), signature.ErrNoMatchingSignature)

	only, err := signature.New("discord", signature.Options{Secrets: []string{other}, Now: clock})
	require.NoError(t, err)
	require.ErrorIs(t, only.Verify(body, signed(now, body)), signature.ErrNoMatchingSignature, "wrong key")

	_, err = signature.New("discord", signature.Options{Secrets: []string{"not-hex"}})
	require.ErrorContains(t, err, "Ed25519 public key")

	p, ok := signature.Lookup("discord")
	require.True(t, ok)
	_, ok = p.MatchHandshake(httptest.NewRequest(http.MethodPost, "/", nil), []byte(`{"type":1}`), "")
	require.True(t, ok)
	_, ok = p.MatchHandshake(httptest.NewRequest(http.MethodPost, "/", nil), body, "")
	require.False(t, ok)
}
