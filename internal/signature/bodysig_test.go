package signature_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tidwall/sjson"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
)

// TestBodySigned covers the presets whose signature lives in the body
// (bodySigned), as TestRoundTrip does for header schemes.
func TestBodySigned(t *testing.T) {
	t.Parallel()
	secrets := map[string][2]string{
		"mailgun":   {"key-mailgun-current", "key-mailgun-previous"},
		"msgraph":   {"client-state-current", "client-state-previous"},
		"adyen":     {adyenKey, adyenKeyOld},
		"midtrans":  {"SB-Mid-server-current", "SB-Mid-server-previous"},
		"braintree": {"bt_public:bt_private_current", "bt_public:bt_private_previous"},
		"sns":       {signingSecret("sns", snsTopic), signingSecret("sns", "arn:aws:sns:eu-west-1:123456789012:previous")},
		"appstore":  {signingSecret("appstore", appBundle), signingSecret("appstore", "com.example.previous")},
	}
	bodies := map[string]string{
		"mailgun":   `{"event-data":{"id":"CPgfbmQMTCKtHW6uIWtuVe","event":"delivered"}}`,
		"msgraph":   `{"value":[{"subscriptionId":"s1","changeType":"created","resource":"Users/1"},{"subscriptionId":"s1","changeType":"updated","resource":"Users/2"}]}`,
		"adyen":     adyenBody,
		"midtrans":  midtransBody,
		"sns":       snsBody,
		"appstore":  appstoreBody,
		"braintree": "bt_payload=" + url.QueryEscape(base64.StdEncoding.EncodeToString([]byte(braintreeXML))),
	}
	require.Len(t, secrets, len(bodySigned))
	for _, name := range bodySigned {
		sign := func(t *testing.T, secret string, at time.Time) string {
			b, err := signature.SignBody(name, signature.Options{Secrets: []string{secret}}, []byte(bodies[name]), at)
			require.NoError(t, err)
			return string(b)
		}
		verify := func(t *testing.T, body string, at time.Time, secrets ...string) error {
			v, err := signature.New(name, signature.Options{Secrets: secrets, Now: clock(at)})
			require.NoError(t, err)
			return v.Verify([]byte(body), http.Header{})
		}
		s := secrets[name]
		cases := []struct {
			name    string
			body    func(t *testing.T) string
			secrets []string
			want    error
		}{
			{"valid", func(t *testing.T) string { return sign(t, s[0], now) }, s[:1], nil},
			{"rotation", func(t *testing.T) string { return sign(t, s[1], now) }, s[:], nil},
			{"wrong secret", func(t *testing.T) string { return sign(t, s[0], now) }, s[1:], signature.ErrNoMatchingSignature},
			{"no signature at all", func(*testing.T) string { return bodies[name] }, s[:1], signature.ErrMissingHeader},
			{"not JSON", func(*testing.T) string { return "token=x" }, s[:1], signature.ErrMissingHeader},
		}
		for _, tc := range cases {
			t.Run(name+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				err := verify(t, tc.body(t), now, tc.secrets...)
				if tc.want == nil {
					require.NoError(t, err)
					return
				}
				require.ErrorIs(t, err, tc.want)
				requireOneSentinel(t, err)
				requireNoLeak(t, err, s[:], http.Header{})
			})
		}
		require.Error(t, signature.Sign(name, signature.Options{Secrets: s[:1]}, []byte("{}"), http.Header{}, now), "Sign refers to SignBody")
	}
}

func TestMailgun(t *testing.T) {
	t.Parallel()
	key := "key-3ax6xnjp29jd6fds4gc373sgvjxteol0"
	// Mailgun's documented formula, computed here independently of the preset.
	mk := func(ts int64, token, secret string) string {
		m := hmac.New(sha256.New, []byte(secret))
		m.Write([]byte(strconv.FormatInt(ts, 10) + token))
		return `{"signature":{"timestamp":"` + strconv.FormatInt(ts, 10) + `","token":"` + token +
			`","signature":"` + hex.EncodeToString(m.Sum(nil)) + `"},"event-data":{"id":"ev1","event":"delivered"}}`
	}
	token := "e6e8a2b4d5f7c9a1b3c5d7e9f1a3b5c7d9e1f3a5b7c9d1e3f5"
	v, err := signature.New("mailgun", signature.Options{Secrets: []string{key}, Now: clock(now)})
	require.NoError(t, err)
	require.NoError(t, v.Verify([]byte(mk(now.Unix(), token, key)), nil))
	require.NoError(t, v.Verify([]byte(mk(now.Unix()-300, token, key)), nil), "exactly the tolerance")
	require.ErrorIs(t, v.Verify([]byte(mk(now.Unix()-301, token, key)), nil), signature.ErrTimestampOutOfTolerance)
	require.ErrorIs(t, v.Verify([]byte(mk(now.Unix(), token, "other")), nil), signature.ErrNoMatchingSignature)
	// The token is signed: swapping it breaks the signature.
	swapped := strings.Replace(mk(now.Unix(), token, key), token, strings.Repeat("0", 50), 1)
	require.ErrorIs(t, v.Verify([]byte(swapped), nil), signature.ErrNoMatchingSignature)
	// Malformed fields.
	bad, _ := sjson.Set(mk(now.Unix(), token, key), "signature.signature", "zz")
	require.ErrorIs(t, v.Verify([]byte(bad), nil), signature.ErrMalformedHeader)
	bad, _ = sjson.Set(mk(now.Unix(), token, key), "signature.timestamp", 1764547200)
	require.ErrorIs(t, v.Verify([]byte(bad), nil), signature.ErrMalformedHeader)
	bad, _ = sjson.Delete(mk(now.Unix(), token, key), "signature.token")
	require.ErrorIs(t, v.Verify([]byte(bad), nil), signature.ErrMissingHeader)
}

func TestGraphClientState(t *testing.T) {
	t.Parallel()
	v, err := signature.New("msgraph", signature.Options{Secrets: []string{"state-1"}})
	require.NoError(t, err)
	require.NoError(t, v.Verify([]byte(`{"value":[{"clientState":"state-1"},{"clientState":"state-1"}]}`), nil))
	require.ErrorIs(t, v.Verify([]byte(`{"value":[{"clientState":"state-1"},{"clientState":"forged"}]}`), nil),
		signature.ErrNoMatchingSignature, "one forged notification refuses the delivery")
	require.ErrorIs(t, v.Verify([]byte(`{"value":[{"clientState":"state-1"},{"resource":"x"}]}`), nil), signature.ErrMissingHeader)
	require.ErrorIs(t, v.Verify([]byte(`{"value":[]}`), nil), signature.ErrMissingHeader)
	require.ErrorIs(t, v.Verify([]byte(`{"value":[{"clientState":7}]}`), nil), signature.ErrMalformedHeader)
}

// Linear's webhookTimestamp is inside the signed body: its SDK refuses more
// than 60 s either way, after the signature matched.
func TestLinearBodyTimestamp(t *testing.T) {
	t.Parallel()
	secret := "lin_wh_secret"
	sign := func(body string) http.Header {
		h := http.Header{}
		m := hmac.New(sha256.New, []byte(secret))
		m.Write([]byte(body))
		h.Set("Linear-Signature", hex.EncodeToString(m.Sum(nil)))
		return h
	}
	at := func(ms int64) string {
		return `{"action":"create","webhookTimestamp":` + strconv.FormatInt(ms, 10) + `}`
	}
	cases := []struct {
		name string
		body string
		tol  time.Duration
		want error
	}{
		{"now", at(now.UnixMilli()), 0, nil},
		{"exactly 60 s old", at(now.UnixMilli() - 60_000), 0, nil},
		{"exactly 60 s ahead", at(now.UnixMilli() + 60_000), 0, nil},
		{"60.001 s old", at(now.UnixMilli() - 60_001), 0, signature.ErrTimestampOutOfTolerance},
		{"60.001 s ahead", at(now.UnixMilli() + 60_001), 0, signature.ErrTimestampOutOfTolerance},
		{"configured 5 min", at(now.UnixMilli() - 120_000), 5 * time.Minute, nil},
		{"missing", `{"action":"create"}`, 0, signature.ErrMissingHeader},
		{"a string", `{"webhookTimestamp":"1764547200000"}`, 0, signature.ErrMalformedHeader},
		{"seconds instead of ms", at(now.Unix()), 0, signature.ErrTimestampOutOfTolerance},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			v, err := signature.New("linear", signature.Options{Secrets: []string{secret}, Tolerance: tc.tol, Now: clock(now)})
			require.NoError(t, err)
			err = v.Verify([]byte(tc.body), sign(tc.body))
			if tc.want == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tc.want)
			requireOneSentinel(t, err)
		})
	}
	// The signature is checked first: an unsigned stale body is "no match".
	v, err := signature.New("linear", signature.Options{Secrets: []string{"other"}, Now: clock(now)})
	require.NoError(t, err)
	body := at(now.UnixMilli() - 3_600_000)
	require.ErrorIs(t, v.Verify([]byte(body), sign(body)), signature.ErrNoMatchingSignature)
}

// Gitea and Forgejo with content type "form" post payload=<json> but sign
// the JSON.
func TestFormWrappedPayload(t *testing.T) {
	t.Parallel()
	payload := `{"ref":"refs/heads/main","commits":[{"id":"bffeb742","message":"a&b=c +é"}]}`
	for _, tc := range []struct{ provider, header string }{{"gitea", "X-Gitea-Signature"}, {"forgejo", "X-Forgejo-Signature"}} {
		t.Run(tc.provider, func(t *testing.T) {
			t.Parallel()
			m := hmac.New(sha256.New, []byte("forge-secret"))
			m.Write([]byte(payload))
			sig := hex.EncodeToString(m.Sum(nil))
			v, err := signature.New(tc.provider, signature.Options{Secrets: []string{"forge-secret"}})
			require.NoError(t, err)
			form := http.Header{}
			form.Set("Content-Type", "application/x-www-form-urlencoded")
			form.Set(tc.header, sig)
			body := url.Values{"payload": {payload}}.Encode()
			require.NoError(t, v.Verify([]byte(body), form))

			js := http.Header{}
			js.Set("Content-Type", "application/json")
			js.Set(tc.header, sig)
			require.NoError(t, v.Verify([]byte(payload), js), "JSON deliveries unchanged")
			require.ErrorIs(t, v.Verify([]byte(body), js), signature.ErrNoMatchingSignature, "a form body is not the JSON")

			two := url.Values{"payload": {payload, payload}}.Encode()
			require.ErrorIs(t, v.Verify([]byte(two), form), signature.ErrNoMatchingSignature)
			require.ErrorIs(t, v.Verify([]byte("other=1"), form), signature.ErrNoMatchingSignature)
			tampered := url.Values{"payload": {strings.Replace(payload, "main", "evil", 1)}}.Encode()
			require.ErrorIs(t, v.Verify([]byte(tampered), form), signature.ErrNoMatchingSignature)

			got, err := signature.FormPayload([]byte(body), form)
			require.NoError(t, err)
			require.Equal(t, payload, string(got))
		})
	}
}

func TestOktaConfigurableHeader(t *testing.T) {
	t.Parallel()
	h := http.Header{}
	h.Set("Authorization", "okta-secret")
	v, err := signature.New("okta", signature.Options{Secrets: []string{"okta-secret"}})
	require.NoError(t, err)
	require.NoError(t, v.Verify(nil, h))

	v, err = signature.New("okta", signature.Options{Secrets: []string{"okta-secret"}, HMAC: signature.HMACOptions{Header: "X-Okta-Hook-Key"}})
	require.NoError(t, err)
	require.ErrorIs(t, v.Verify(nil, h), signature.ErrMissingHeader, "the configured header replaces Authorization")
	h.Set("X-Okta-Hook-Key", "okta-secret")
	require.NoError(t, v.Verify(nil, h))
	h.Set("X-Okta-Hook-Key", "wrong")
	require.ErrorIs(t, v.Verify(nil, h), signature.ErrNoMatchingSignature)

	_, err = signature.New("okta", signature.Options{Secrets: []string{"s"}, HMAC: signature.HMACOptions{Header: "X", Algorithm: "sha1"}})
	require.ErrorContains(t, err, "cannot be overridden")
	_, err = signature.New("okta", signature.Options{Secrets: []string{"s"}, HMAC: signature.HMACOptions{Header: "Bad Header:"}})
	require.ErrorContains(t, err, "not a valid header name")
}

// Twitch and Box write their timestamps as RFC 3339 dates.
func TestDatedTimestamps(t *testing.T) {
	t.Parallel()
	secret := "twitch-secret-0123"
	id := "e76c6bd4-55c9-4987-8304-da1588d8988b"
	body := `{"subscription":{"type":"channel.follow"}}`
	sign := func(ts string) http.Header {
		m := hmac.New(sha256.New, []byte(secret))
		m.Write([]byte(id + ts + body))
		h := http.Header{}
		h.Set("Twitch-Eventsub-Message-Id", id)
		h.Set("Twitch-Eventsub-Message-Timestamp", ts)
		h.Set("Twitch-Eventsub-Message-Signature", "sha256="+hex.EncodeToString(m.Sum(nil)))
		return h
	}
	v, err := signature.New("twitch", signature.Options{Secrets: []string{secret}, Now: clock(now)})
	require.NoError(t, err)
	for _, ts := range []string{
		now.UTC().Format(time.RFC3339Nano),
		now.Add(-9 * time.Minute).UTC().Format("2006-01-02T15:04:05.000000000Z07:00"), // Twitch's nanoseconds
		now.Add(3 * time.Minute).In(time.FixedZone("", -8*3600)).Format(time.RFC3339),
	} {
		require.NoError(t, v.Verify([]byte(body), sign(ts)), ts)
	}
	require.ErrorIs(t, v.Verify([]byte(body), sign(now.Add(-11*time.Minute).UTC().Format(time.RFC3339))), signature.ErrTimestampOutOfTolerance)
	require.ErrorIs(t, v.Verify([]byte(body), sign(strconv.FormatInt(now.Unix(), 10))), signature.ErrMalformedHeader, "Unix digits are not Twitch's format")
	require.ErrorIs(t, v.Verify([]byte(body), sign("2025-13-45T99:00:00Z")), signature.ErrMalformedHeader)
}

// EasyPost signs integer weights as floats; its library rewrites them
// before hashing (scripts/oracles has the library's vector).
func TestEasyPostWeights(t *testing.T) {
	t.Parallel()
	secret := "ep-secret"
	mac := func(s string) http.Header {
		m := hmac.New(sha256.New, []byte(secret))
		m.Write([]byte(s))
		h := http.Header{}
		h.Set("X-Hmac-Signature", "hmac-sha256-hex="+hex.EncodeToString(m.Sum(nil)))
		return h
	}
	v, err := signature.New("easypost", signature.Options{Secrets: []string{secret}})
	require.NoError(t, err)
	require.NoError(t, v.Verify([]byte(`{"weight":10,"x":{"weight": 7 }}`), mac(`{"weight":10.0,"x":{"weight": 7.0}}`)))
	require.NoError(t, v.Verify([]byte(`{"weight":10.5}`), mac(`{"weight":10.5}`)))
	require.ErrorIs(t, v.Verify([]byte(`{"weight":10}`), mac(`{"weight":10}`)), signature.ErrNoMatchingSignature)
}

// SignDelivery signs every preset, writing into the body where the provider
// does; the result verifies.
func TestSignDeliveryEveryPreset(t *testing.T) {
	t.Parallel()
	secretFor := map[string][2]string{} // signing, verifying
	for _, f := range fixtures {
		pub, err := signature.PublicSecret(f.provider, f.secrets[0])
		require.NoError(t, err)
		secretFor[f.provider] = [2]string{f.secrets[0], pub}
	}
	for _, name := range bodySigned {
		secretFor[name] = [2]string{"body-secret", "body-secret"}
	}
	secretFor["sns"] = [2]string{signingSecret("sns", snsTopic), snsTopic}
	secretFor["appstore"] = [2]string{signingSecret("appstore", appBundle), appBundle}
	secretFor["adyen"] = [2]string{adyenKey, adyenKey}
	secretFor["midtrans"] = [2]string{"SB-Mid-server-rt", "SB-Mid-server-rt"}
	secretFor["braintree"] = [2]string{"bt_public:bt_private", "bt_public:bt_private"}
	bodyFor := map[string]string{"adyen": adyenBody, "midtrans": midtransBody, "braintree": braintreeXML}
	for _, name := range signature.Providers() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var f fixture
			for _, g := range fixtures {
				if g.provider == name {
					f = g
				}
			}
			h := http.Header{}
			for k, v := range f.prep {
				h.Set(k, v)
			}
			body := `{"id":"evt_1","event-data":{"id":"e1"},"data":{"amount":1000}}`
			if b, ok := bodyFor[name]; ok {
				body = b
			}
			s := secretFor[name]
			o := signature.Options{Secrets: []string{s[0]}, URL: f.url, HMAC: f.hmac, Now: clock(now)}
			out, err := signature.SignDelivery(name, o, []byte(body), h, now)
			require.NoError(t, err)
			o.Secrets = []string{s[1]}
			v, err := signature.New(name, o)
			require.NoError(t, err)
			require.NoError(t, v.Verify(out, h))
		})
	}
}
