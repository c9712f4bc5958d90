package signature_test

import (
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
)

// TestStreamingAgreesWithVerify checks, for every preset whose verifier
// streams, that VerifyReader gives Verify's verdict on the same delivery:
// valid, tampered, wrong secret, rotation either way, the body read a byte
// at a time.
func TestStreamingAgreesWithVerify(t *testing.T) {
	t.Parallel()
	streams := map[string]bool{}
	for _, f := range fixtures {
		t.Run(f.provider, func(t *testing.T) {
			h := f.signed(t, f.secrets[0], f.body, now)
			for _, tc := range []struct {
				name    string
				secrets []string
				body    string
			}{
				{"valid", f.secrets[:1], f.body},
				{"tampered", f.secrets[:1], strings.Replace(f.body, "e", "E", 1)},
				{"wrong secret", f.secrets[1:], f.body},
				{"rotation old first", []string{f.secrets[1], f.secrets[0]}, f.body},
			} {
				pub := make([]string, len(tc.secrets))
				for i, s := range tc.secrets {
					var err error
					pub[i], err = signature.PublicSecret(f.provider, s)
					require.NoError(t, err)
				}
				v, err := signature.New(f.provider, f.options(now, pub...))
				require.NoError(t, err)
				sv := signature.Streaming(v)
				if sv == nil {
					return
				}
				streams[f.provider] = true
				want := v.Verify([]byte(tc.body), h)
				got := sv.VerifyReader(iotest.OneByteReader(strings.NewReader(tc.body)), h)
				if want == nil {
					require.NoError(t, got, tc.name)
					continue
				}
				require.Error(t, got, tc.name)
				require.Equal(t, want.Error(), got.Error(), tc.name)
			}
		})
	}
	// The presets the gateway spills: an HMAC over the body alone or with
	// a timestamp and ID around it, or a token that binds no body. Schemes that read the body themselves
	// never stream.
	for _, name := range []string{"github", "gitlab", "hmac", "shopify", "slack", "standard"} {
		require.True(t, streams[name], "%s should stream", name)
	}
	for _, name := range []string{"stripe", "twilio"} { // a JSON object required; form fields signed
		require.False(t, streams[name], "%s must not stream", name)
	}
}

// TestStreamingReadError: a body that cannot be read is no verdict on the
// delivery: the reader's own error, wrapping no sentinel.
func TestStreamingReadError(t *testing.T) {
	t.Parallel()
	f := fixtures[1] // github
	require.Equal(t, "github", f.provider)
	h := f.signed(t, f.secrets[0], f.body, now)
	v, err := signature.New(f.provider, f.options(now, f.secrets[0]))
	require.NoError(t, err)
	errDisk := errors.New("disk gone")
	err = signature.Streaming(v).VerifyReader(io.MultiReader(strings.NewReader(f.body[:10]), iotest.ErrReader(errDisk)), h)
	require.ErrorIs(t, err, errDisk)
	for _, sentinel := range []error{signature.ErrNoMatchingSignature, signature.ErrMalformedHeader, signature.ErrMissingHeader} {
		require.NotErrorIs(t, err, sentinel)
	}
	// The headers are judged before the body is read.
	h.Del("X-Hub-Signature-256")
	h.Del("X-Hub-Signature")
	err = signature.Streaming(v).VerifyReader(iotest.ErrReader(errDisk), h)
	require.ErrorIs(t, err, signature.ErrMissingHeader)
}
