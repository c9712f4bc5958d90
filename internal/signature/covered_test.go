package signature_test

import (
	"bytes"
	"crypto/elliptic"
	"encoding/base64"
	"math/big"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
)

// TestCoveredIgnoresWhatTheSignatureDoesNot: for the schemes that sign less
// than the body's bytes, a signed body re-encoded in a way the signature
// cannot see still verifies and has the same Covered value, while another
// signed body has another: replay records keyed on Covered recognise the
// capture and nothing else.
func TestCoveredIgnoresWhatTheSignatureDoesNot(t *testing.T) {
	t.Parallel()
	const hookURL = "https://hooks.example.test/hook"
	form := http.Header{"Content-Type": {"application/x-www-form-urlencoded"}}
	jsonSet := func(path, value string) func(string) string {
		return func(b string) string {
			out, err := sjson.SetRaw(b, path, value)
			if err != nil {
				panic(err)
			}
			return out
		}
	}
	spaced := func(b string) string { return strings.Replace(b, ":", ": ", 1) }
	bt := func(xml string) string {
		return "bt_payload=" + url.QueryEscape(base64.StdEncoding.EncodeToString([]byte(xml))+"\n")
	}
	for _, tc := range []struct {
		provider, secret string
		header           http.Header
		body, other      string
		reencode         []func(string) string
	}{
		{
			provider: "twilio", secret: "tw", header: form,
			body: "AccountSid=AC1&Body=Hi&From=%2B1555", other: "AccountSid=AC1&Body=Ho&From=%2B1555",
			reencode: []func(string) string{
				func(string) string { return "From=%2b1555&Body=Hi&AccountSid=AC1" },
				func(string) string { return "AccountSidAC1BodyHiFrom%2B1555" },
			},
		},
		{
			provider: "mandrill", secret: "md", header: form,
			body: "mandrill_events=%5B%5D", other: "mandrill_events=%5B1%5D",
			reencode: []func(string) string{func(string) string { return "mandrill_events=[]" }},
		},
		{
			provider: "plivo", secret: "pl", header: form,
			body: "CallUUID=c1&To=2", other: "CallUUID=c2&To=2",
			reencode: []func(string) string{func(string) string { return "To=2&CallUUID=c1" }},
		},
		{
			provider: "gitea", secret: "gt", header: form,
			body: "payload=" + url.QueryEscape(`{"after":"c0ffee"}`), other: "payload=" + url.QueryEscape(`{"after":"decaf"}`),
			reencode: []func(string) string{func(b string) string { return "x=1&" + b }},
		},
		{
			provider: "braintree", secret: "bt_public:bt_private",
			body: bt(`<notification><kind>a</kind></notification>`), other: bt(`<notification><kind>b</kind></notification>`),
			reencode: []func(string) string{func(b string) string {
				vals, _ := url.ParseQuery(b)
				vals.Set("bt_payload", strings.TrimSuffix(vals.Get("bt_payload"), "\n"))
				return vals.Encode()
			}},
		},
		{
			provider: "sns", secret: signingSecret("sns", snsTopic), body: snsBody,
			other:    strings.Replace(snsBody, `\"order\":1000`, `\"order\":1001`, 1),
			reencode: []func(string) string{spaced, jsonSet("UnsubscribeURL", `"https://sns.us-east-1.amazonaws.com/?x"`)},
		},
		{
			provider: "adyen", secret: adyenKey, body: adyenBody,
			other: strings.Replace(adyenBody, `"value":1000`, `"value":1001`, 1),
			reencode: []func(string) string{
				spaced,
				jsonSet("live", `"true"`),
				jsonSet("notificationItems.0.NotificationRequestItem.reason", `"changed"`),
			},
		},
		{
			provider: "appstore", secret: signingSecret("appstore", appBundle), body: appstoreBody,
			other:    strings.Replace(appstoreBody, "DID_RENEW", "EXPIRED", 1),
			reencode: []func(string) string{spaced, jsonSet("extra", "1"), jwsSignature(highS), jwsSignature(unreadBits)},
		},
	} {
		t.Run(tc.provider, func(t *testing.T) {
			t.Parallel()
			opts := signature.Options{Secrets: []string{tc.secret}, URL: hookURL, Now: clock(now)}
			p, ok := signature.Lookup(tc.provider)
			require.True(t, ok)
			v, err := signature.New(tc.provider, opts)
			require.NoError(t, err)
			sign := func(body string) (string, http.Header) {
				h := tc.header.Clone()
				if h == nil {
					h = http.Header{}
				}
				signed := []byte(body)
				if tc.provider == "gitea" { // signs the payload field
					payload, err := signature.FormPayload(signed, h)
					require.NoError(t, err)
					require.NoError(t, signature.Sign(tc.provider, opts, payload, h, now))
				} else {
					signed, err = signature.SignDelivery(tc.provider, opts, signed, h, now)
					require.NoError(t, err)
				}
				require.NoError(t, v.Verify(signed, h))
				return string(signed), h
			}
			body, h := sign(tc.body)
			other, oh := sign(tc.other)
			require.NotEqual(t, p.Covered([]byte(body), h), p.Covered([]byte(other), oh), "another event")
			for i, re := range tc.reencode {
				changed := re(body)
				require.NotEqual(t, body, changed, "re-encoding %d", i)
				require.NoError(t, v.Verify([]byte(changed), h), "re-encoding %d verifies", i)
				require.Equal(t, string(p.Covered([]byte(body), h)), string(p.Covered([]byte(changed), h)), "re-encoding %d", i)
			}
		})
	}
}

// jwsSignature re-spells the signature of a body's signedPayload with f.
func jwsSignature(f func([]byte) []byte) func(string) string {
	return func(b string) string {
		sp := gjson.Get(b, "signedPayload").Str
		i := strings.LastIndexByte(sp, '.')
		sig, err := base64.RawURLEncoding.DecodeString(sp[i+1:])
		if err != nil {
			panic(err)
		}
		out, err := sjson.Set(b, "signedPayload", sp[:i+1]+string(f(sig)))
		if err != nil {
			panic(err)
		}
		return out
	}
}

// highS is ES256's (r, N−s): a second signature of the same input, which
// crypto/ecdsa accepts.
func highS(sig []byte) []byte {
	s := new(big.Int).SetBytes(sig[32:])
	s.Sub(elliptic.P256().Params().N, s)
	out := bytes.Clone(sig)
	s.FillBytes(out[32:])
	return []byte(base64.RawURLEncoding.EncodeToString(out))
}

// unreadBits sets a bit of the last base64url character that encodes no
// bit of the 64 bytes (86 characters carry 516 bits).
func unreadBits(sig []byte) []byte {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	enc := []byte(base64.RawURLEncoding.EncodeToString(sig))
	last := strings.IndexByte(alphabet, enc[len(enc)-1])
	enc[len(enc)-1] = alphabet[last^1]
	return enc
}

// TestCoveredSweep tries every preset with re-encodings a signature may not
// see. Whatever still verifies must keep its Covered value, or a replay
// record keyed on it misses the capture. The presets that sign the body in
// it (bodySigned) are in TestCoveredIgnoresWhatTheSignatureDoesNot; of
// those, Midtrans signs three fields and Mailgun and Graph no event data
// (docs/security.md).
func TestCoveredSweep(t *testing.T) {
	t.Parallel()
	mutations := []struct {
		name string
		f    func(string) string
	}{
		{"json re-spaced", func(b string) string { return strings.Replace(b, ":", ": ", 1) }},
		{"json member added", func(b string) string {
			out, err := sjson.SetRaw(b, "zz_extra", "1")
			if err != nil {
				return b
			}
			return out
		}},
		{"newline added", func(b string) string { return b + "\n" }},
		{"form reordered", func(b string) string {
			parts := strings.Split(b, "&")
			for i, j := 0, len(parts)-1; i < j; i, j = i+1, j-1 {
				parts[i], parts[j] = parts[j], parts[i]
			}
			return strings.Join(parts, "&")
		}},
		{"form re-encoded", func(b string) string {
			return strings.NewReplacer("+", "%20", "%2B", "%2b", "%3A", ":").Replace(b)
		}},
		{"form split elsewhere", func(b string) string { return strings.Replace(b, "&", "", 1) }},
		{"form parameter added", func(b string) string { return b + "&zz_extra=" }},
	}
	check := func(t *testing.T, provider string, p signature.Preset, v signature.Verifier, body string, h http.Header) {
		for _, m := range mutations {
			changed := m.f(body)
			if changed == body || v.Verify([]byte(changed), h.Clone()) != nil {
				continue
			}
			require.Equal(t, string(p.Covered([]byte(body), h)), string(p.Covered([]byte(changed), h)),
				"%s: %q verifies under the same signature with another Covered", provider, m.name)
		}
	}
	for _, fx := range fixtures {
		if tokenLike[fx.provider] || unsignedBody[fx.provider] {
			continue // no byte of the body is signed: docs/security.md
		}
		t.Run(fx.provider, func(t *testing.T) {
			t.Parallel()
			h := fx.signed(t, fx.secrets[0], fx.body, now)
			pub, err := signature.PublicSecret(fx.provider, fx.secrets[0])
			require.NoError(t, err)
			v, err := signature.New(fx.provider, fx.options(now, pub))
			require.NoError(t, err)
			require.NoError(t, v.Verify([]byte(fx.body), h.Clone()))
			check(t, fx.provider, fx.preset(t), v, fx.body, h)
		})
	}
}
